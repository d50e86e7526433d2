//! Reverse-mode autograd: each op on a tensor that requires grad records a `GradNode` (its
//! inputs, kept alive, and what to differentiate); `backward` walks the nodes reachable from
//! the loss in reverse recording order and emits the gradient ops as more instructions.
//! PyTorch semantics: gradients accumulate on leaves across `backward` calls until zeroed,
//! non-leaves keep none, a graph is freed by the `backward` that used it.

use crate::tensor::{creation_zeros, Arg, Context, Misuse, Result, Tensor, TensorError};
use foldhash::HashMap;
use gt_ir::formula::{Algebra, Term, Var};
use gt_ir::verify::shape;
use gt_ir::{BinaryOp, ReduceOp, SliceItem, TensorType, UnaryOp, ValueId};
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

/// An operand of a recorded binary op: input `i` of the node, or a scalar.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    Input(usize),
    Scalar(f64),
}

/// What a node differentiates (with the attributes the gradient needs).
#[derive(Debug, Clone)]
pub(crate) enum GradOp {
    Unary(UnaryOp),
    Binary {
        op: BinaryOp,
        lhs: Side,
        rhs: Side,
    },
    /// Input 0 is the condition (no gradient).
    Where {
        on_true: Side,
        on_false: Side,
    },
    MatMul,
    Reduce {
        op: ReduceOp,
        axes: Option<Vec<i64>>,
        keepdim: bool,
    },
    Transpose {
        dim0: i64,
        dim1: i64,
    },
    Permute {
        perm: Vec<i64>,
    },
    /// reshape, squeeze, unsqueeze: the gradient is reshaped back.
    Reshape,
    /// `cast` between float dtypes: the gradient is cast back.
    Cast,
    BroadcastTo,
    Slice {
        index: Vec<SliceItem>,
    },
    Concat {
        axis: i64,
    },
    /// One result of `split`/`chunk`: elements `start..start+len` of `axis`.
    SplitPiece {
        axis: usize,
        start: usize,
        len: usize,
    },
}

/// A recorded op.
pub(crate) struct GradNode {
    seq: u64,
    op: GradOp,
    name: &'static str,
    /// Released (emptied) by the backward that used the node.
    inputs: RefCell<Vec<Tensor>>,
    /// The inputs' values as they were when the op ran (remote values never change, so an
    /// in-place update of an input afterwards cannot change this op's gradient).
    values: RefCell<Vec<Tensor>>,
    output: RefCell<Weak<crate::tensor::Inner>>,
    out_id: ValueId,
    out_ty: TensorType,
    released: Cell<bool>,
    /// The signal of its gradient ops: the backward signal of the scope it was recorded in.
    backward_signal: Option<BackwardScope>,
}

impl GradNode {
    pub(crate) fn new(
        ctx: &Context,
        op: GradOp,
        name: &'static str,
        inputs: &[&Tensor],
        out_id: ValueId,
        out_ty: TensorType,
    ) -> Rc<GradNode> {
        let seq = ctx.node_seq.get();
        ctx.node_seq.set(seq + 1);
        Rc::new(GradNode {
            seq,
            op,
            name,
            inputs: RefCell::new(inputs.iter().map(|t| (*t).clone()).collect()),
            values: RefCell::new(inputs.iter().map(|t| t.detach()).collect()),
            output: RefCell::new(Weak::new()),
            out_id,
            out_ty,
            released: Cell::new(false),
            backward_signal: crate::signal::current().map(|s| match &s.backward {
                Some(b) => BackwardScope { name: b.clone(), configured: true },
                None => BackwardScope { name: s.name.clone(), configured: false },
            }),
        })
    }

    pub(crate) fn set_output(&self, t: &Tensor) {
        *self.output.borrow_mut() = Rc::downgrade(&t.0);
    }

    /// The op's mnemonic.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.get()
    }

    /// What `debug::get_tape` shows of it.
    pub(crate) fn entry(&self) -> TapeEntry {
        // The ids the op read (an input updated in place since has another id now).
        let inputs = self.values.borrow().iter().map(|t| t.id()).collect();
        TapeEntry { output: self.out_id, ty: self.out_ty.clone(), op: self.name, inputs }
    }

    /// The result, for gradients that reuse it (exp, sigmoid, ...).
    fn output(&self) -> Result<Tensor> {
        let out = self.output.borrow().upgrade().map(Tensor);
        match out {
            Some(t) if t.version() == 0 => Ok(t),
            Some(_) => Err(modified(self.name, "its result")),
            None => Err(TensorError::invalid("backward", Misuse::ResultGone { op: self.name })),
        }
    }
}

fn modified(op: &'static str, what: &'static str) -> TensorError {
    TensorError::invalid("backward", Misuse::ModifiedInPlace { op, what })
}

/// One recorded op, as `debug::get_tape` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct TapeEntry {
    /// The result's id.
    pub output: ValueId,
    /// The result's type.
    pub ty: TensorType,
    /// The op.
    pub op: &'static str,
    /// The tensor operands' ids.
    pub inputs: Vec<ValueId>,
}

impl Tensor {
    /// Computes the gradient of this one-element tensor (a loss) with respect to every leaf
    /// that requires grad and adds it to the leaf's [`Tensor::grad`]. Frees the graph.
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(TensorError::invalid(
                "backward",
                Misuse::LossNotScalar { numel: self.numel(), ty: Box::new(self.ty().clone()) },
            ));
        }
        self.check_requires_grad()?;
        let seed = {
            let ctx = self.ctx();
            let _off = ctx.no_grad();
            crate::tensor::ones_of(&ctx, self.ty().clone())?
        };
        self.backward_with(&seed)
    }

    fn check_requires_grad(&self) -> Result<()> {
        if !self.requires_grad() {
            return Err(TensorError::invalid("backward", Misuse::NoGrad));
        }
        Ok(())
    }

    /// As [`Tensor::backward`], starting from `grad` (this tensor's gradient, same type).
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        if grad.ty() != self.ty() {
            let misuse = Misuse::GradType { grad: Box::new(grad.ty().clone()), tensor: Box::new(self.ty().clone()) };
            return Err(TensorError::invalid("backward", misuse));
        }
        self.check_requires_grad()?;
        let ctx = self.ctx();
        let _off = ctx.no_grad();
        let Some(root) = self.0.grad_fn.clone() else {
            accumulate_leaf(self, grad.detach())?;
            return Ok(());
        };
        // Every node the loss depends on; recording order is a topological order.
        let mut order = vec![root.clone()];
        let mut seen: HashMap<*const GradNode, ()> = [(Rc::as_ptr(&root), ())].into_iter().collect();
        let mut i = 0;
        while i < order.len() {
            let inputs = order[i].inputs.borrow().clone();
            for t in inputs {
                if let Some(n) = &t.0.grad_fn {
                    if seen.insert(Rc::as_ptr(n), ()).is_none() {
                        order.push(n.clone());
                    }
                }
            }
            i += 1;
        }
        order.sort_by_key(|n| std::cmp::Reverse(n.seq));
        let mut grads: HashMap<*const GradNode, Tensor> = [(Rc::as_ptr(&root), grad.detach())].into_iter().collect();
        let mut leaves: Vec<(Tensor, Tensor)> = Vec::new();
        let mut signal = BackwardSignal { ctx: &ctx, open: None };
        for node in &order {
            let Some(g) = grads.remove(&Rc::as_ptr(node)) else { continue };
            signal.switch(node.backward_signal.as_ref())?;
            if node.released.get() {
                return Err(TensorError::invalid("backward", Misuse::GraphFreed { op: node.name }));
            }
            let inputs = node.inputs.borrow().clone();
            let wants: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
            let values = node.values.borrow().clone();
            let input_grads = input_grads(node, &g, &values, &wants)?;
            for (t, gi) in inputs.iter().zip(input_grads) {
                let Some(gi) = gi else { continue };
                // A gradient has its input's dtype, as in PyTorch: an `f32` weight meeting
                // `f64` data gets an `f32` gradient, which its optimizer's update can take.
                let gi = if gi.dtype() == t.dtype() { gi } else { gi.to(t.dtype())? };
                match &t.0.grad_fn {
                    Some(n) => {
                        let key = Rc::as_ptr(n);
                        let sum = match grads.remove(&key) {
                            Some(old) => old.add(&gi)?,
                            None => gi,
                        };
                        grads.insert(key, sum);
                    }
                    None => match leaves.iter_mut().find(|(l, _)| l.same(t)) {
                        Some((_, old)) => *old = old.add(&gi)?,
                        None => leaves.push((t.clone(), gi)),
                    },
                }
            }
        }
        signal.switch(None)?;
        for (leaf, g) in leaves {
            accumulate_leaf(&leaf, g)?;
        }
        for node in &order {
            node.released.set(true);
            node.inputs.borrow_mut().clear();
            node.values.borrow_mut().clear();
        }
        Ok(())
    }
}

/// The backward scope of a node's gradient ops: the configured backward signal of the scope
/// it was recorded in, or else that scope's own name marked backward.
#[derive(Debug, Clone)]
struct BackwardScope {
    name: String,
    configured: bool,
}

/// The backward signal scope open around gradient ops (switched as nodes need).
struct BackwardSignal<'a> {
    ctx: &'a Context,
    open: Option<String>,
}

impl BackwardSignal<'_> {
    fn switch(&mut self, to: Option<&BackwardScope>) -> Result<()> {
        if self.open.as_deref() == to.map(|s| s.name.as_str()) {
            return Ok(());
        }
        if let Some(name) = self.open.take() {
            self.ctx.submit(&gt_ir::Instr::SignalEnd { name })?;
        }
        if let Some(scope) = to {
            self.ctx.submit(&crate::signal::backward_marker(&scope.name, scope.configured))?;
            self.open = Some(scope.name.clone());
        }
        Ok(())
    }
}

impl Drop for BackwardSignal<'_> {
    fn drop(&mut self) {
        // An error left a scope open: close it so the stream stays balanced.
        if let Some(name) = self.open.take() {
            let _ = self.ctx.submit(&gt_ir::Instr::SignalEnd { name });
        }
    }
}

fn accumulate_leaf(leaf: &Tensor, g: Tensor) -> Result<()> {
    // A handle of its own: two leaves may receive the same gradient tensor, and an in-place
    // change of one leaf's gradient (clipping) must not change the other's.
    let sum = match leaf.grad() {
        Some(old) => old.add(&g)?,
        None => g.detach(),
    };
    leaf.set_grad(Some(sum));
    Ok(())
}

fn dims_i64(dims: &[usize]) -> Vec<i64> {
    dims.iter().map(|&d| d as i64).collect()
}

/// `g` summed down to `dims` (undoing broadcasting: leading axes, and axes that were 1).
fn sum_to(g: Tensor, dims: &[usize]) -> Result<Tensor> {
    if g.shape() == dims {
        return Ok(g);
    }
    let lead = g.rank() - dims.len();
    let mut axes: Vec<i64> = (0..lead as i64).collect();
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 && g.shape()[lead + i] != 1 {
            axes.push((lead + i) as i64);
        }
    }
    let s = if axes.is_empty() { g } else { g.sum_dims(&axes, true)? };
    reshaped(s, dims)
}

/// `g` with shape `dims`: itself when it has it already (gradients are fresh values, so no
/// copy is needed; a matmul's backward asked for four such copies, one of each weight's size).
fn reshaped(g: Tensor, dims: &[usize]) -> Result<Tensor> {
    if g.shape() == dims {
        Ok(g)
    } else {
        g.reshape(&dims_i64(dims))
    }
}

/// Zeros shaped like `like` with `axis` of length `len`.
fn zeros_along(like: &Tensor, axis: usize, len: usize) -> Result<Tensor> {
    let mut dims = like.shape().to_vec();
    dims[axis] = len;
    creation_zeros(&like.ctx(), TensorType::new(like.dtype(), dims))
}

/// `g` with `before` zeros in front and `after` behind along `axis`.
fn pad_axis(g: Tensor, axis: usize, before: usize, after: usize) -> Result<Tensor> {
    if before == 0 && after == 0 {
        return Ok(g);
    }
    let mut parts = Vec::new();
    if before > 0 {
        parts.push(zeros_along(&g, axis, before)?);
    }
    parts.push(g.clone());
    if after > 0 {
        parts.push(zeros_along(&g, axis, after)?);
    }
    crate::tensor::cat(&parts.iter().collect::<Vec<_>>(), axis as i64)
}

/// `g[.., start:end:step (on axis), ..]`.
fn slice_axis(g: &Tensor, axis: usize, start: Option<i64>, end: Option<i64>, step: i64) -> Result<Tensor> {
    let mut index = vec![SliceItem::Range { start: None, end: None, step: 1 }; axis];
    index.push(SliceItem::Range { start, end, step });
    g.slice(&index)
}

/// The gradient of a slice: `g` scattered into zeros of the input's shape, axis by axis.
fn slice_grad(g: &Tensor, input: &[usize], index: &[SliceItem]) -> Result<Tensor> {
    let r = shape::resolve_slice(index, &gt_ir::Shape::new(input.to_vec()))
        .map_err(|source| TensorError::Type { op: "slice", source })?;
    if r.axes.iter().any(|a| a.len == 0) {
        return creation_zeros(&g.ctx(), TensorType::new(g.dtype(), input.to_vec()));
    }
    // The result's elements in input-axis order: indexed axes back as 1, new axes gone.
    let mut g = g.reshape(&r.axes.iter().map(|a| a.len as i64).collect::<Vec<_>>())?;
    for (ax, a) in r.axes.iter().enumerate() {
        let (n, len) = (input[ax], a.len);
        if len == n && a.step == 1 {
            continue;
        }
        let (mut start, mut step) = (a.start, a.step);
        if step < 0 {
            g = slice_axis(&g, ax, None, None, -1)?;
            step = -step;
            start -= (len - 1) * step as usize;
        }
        let step = step as usize;
        if step > 1 && len > 1 {
            // Interleave step-1 zeros after each element, then drop the trailing ones.
            let column = g.unsqueeze(ax as i64 + 1)?;
            let spread = crate::tensor::cat(&[&column, &zeros_along(&column, ax + 1, step - 1)?], ax as i64 + 1)?;
            let mut dims = dims_i64(g.shape());
            dims[ax] = (len * step) as i64;
            g = slice_axis(&spread.reshape(&dims)?, ax, Some(0), Some(((len - 1) * step + 1) as i64), 1)?;
        }
        let span = if len > 1 { (len - 1) * step + 1 } else { 1 };
        g = pad_axis(g, ax, start, n - start - span)?;
    }
    Ok(g)
}

/// A value in a gradient formula: a tensor, or a scalar operand (folded on the host).
#[derive(Clone)]
enum Val {
    T(Tensor),
    S(f64),
}

impl Val {
    fn arg(&self) -> Arg<'_> {
        match self {
            Val::T(t) => Arg::Tensor(t),
            Val::S(s) => Arg::Scalar(*s),
        }
    }
}

/// Evaluates an op table gradient formula (`gt_ir::ops`) as tensor ops: `x`/`a`, `b` are the
/// operands the op read, `y` its result, `g` the incoming gradient.
struct Formula<'a> {
    node: &'a GradNode,
    g: &'a Tensor,
    operands: [Option<Val>; 2],
}

impl Formula<'_> {
    /// The gradient, as a tensor.
    fn grad(mut self, formula: &Term) -> Result<Tensor> {
        let g = self.g.clone();
        match formula.eval(&mut self)? {
            Val::T(t) => Ok(t),
            // A constant gradient, spread over the incoming gradient's shape.
            Val::S(c) => g.mul(0.0)?.add(c),
        }
    }
}

impl Algebra for Formula<'_> {
    type Value = Val;
    type Error = TensorError;
    fn var(&mut self, var: Var) -> Result<Val> {
        match var {
            Var::Operand(i) => self
                .operands
                .get(i as usize)
                .cloned()
                .flatten()
                .ok_or_else(|| TensorError::invalid("backward", Misuse::FormulaOperand { op: self.node.name })),
            Var::Result => self.node.output().map(Val::T),
            Var::Grad => Ok(Val::T(self.g.clone())),
        }
    }
    fn constant(&mut self, c: f64) -> Result<Val> {
        Ok(Val::S(c))
    }
    fn unary(&mut self, op: UnaryOp, x: Val) -> Result<Val> {
        Ok(match x {
            Val::T(t) => Val::T(t.unary(op)?),
            Val::S(s) => Val::S(f64::from(op.apply(s as f32))),
        })
    }
    fn binary(&mut self, op: BinaryOp, x: Val, y: Val) -> Result<Val> {
        // Formulas take a comparison as 0 or 1 (`(sub (gt x 0) (lt x 0))`), where tensors
        // give bools: arithmetic on two of them takes them as the gradient's dtype, which
        // promotion would not (PyTorch refuses `bool - bool`).
        let as_number = |v: Val, g: &Tensor| -> Result<Val> {
            Ok(match v {
                Val::T(t) if t.dtype() == gt_ir::DType::Bool => Val::T(t.to(g.dtype())?),
                v => v,
            })
        };
        let both_bool = [&x, &y].iter().all(|v| !matches!(v, Val::T(t) if t.dtype() != gt_ir::DType::Bool));
        let (x, y) =
            if !op.is_comparison() && both_bool { (as_number(x, self.g)?, as_number(y, self.g)?) } else { (x, y) };
        Ok(match (&x, &y) {
            (Val::S(a), Val::S(b)) => Val::S(f64::from(op.apply(*a as f32, *b as f32))),
            _ => Val::T(crate::tensor::binary(op, x.arg(), y.arg())?),
        })
    }
    fn select(&mut self, c: Val, t: Val, f: Val) -> Result<Val> {
        match c {
            Val::T(c) => Ok(Val::T(crate::tensor::where_(&c, t.arg(), f.arg())?)),
            // `truth` decided a scalar condition before its branches were evaluated.
            Val::S(s) => Ok(if s != 0.0 { t } else { f }),
        }
    }
    fn truth(&mut self, c: &Val) -> Option<bool> {
        match c {
            Val::S(s) => Some(*s != 0.0),
            Val::T(_) => None,
        }
    }
}

/// The gradient of each input (None where none is needed).
/// `inputs` are the values the op read; `wants[i]`: whether input `i` needs a gradient.
fn input_grads(node: &GradNode, g: &Tensor, inputs: &[Tensor], wants: &[bool]) -> Result<Vec<Option<Tensor>>> {
    let wants = |i: usize| wants[i];
    let mut out: Vec<Option<Tensor>> = vec![None; inputs.len()];
    match &node.op {
        GradOp::Unary(op) => {
            let operands = [Some(Val::T(inputs[0].clone())), None];
            out[0] = Some(Formula { node, g, operands }.grad(op.gradient())?);
        }
        GradOp::Binary { op, lhs, rhs } => {
            // Comparisons record no node, so every recorded binary op has gradients.
            let Some(grads) = op.gradients() else { return Ok(out) };
            let val = |side: &Side| match side {
                Side::Input(i) => Val::T(inputs[*i].clone()),
                Side::Scalar(s) => Val::S(*s),
            };
            let operands = [Some(val(lhs)), Some(val(rhs))];
            for (side, formula) in [lhs, rhs].into_iter().zip(grads) {
                if let Side::Input(i) = side {
                    if wants(*i) {
                        let gi = Formula { node, g, operands: operands.clone() }.grad(formula)?;
                        out[*i] = Some(sum_to(gi, inputs[*i].shape())?);
                    }
                }
            }
        }
        GradOp::Where { on_true, on_false } => {
            let cond = &inputs[0];
            if let Side::Input(i) = on_true {
                if wants(*i) {
                    out[*i] = Some(sum_to(crate::tensor::where_(cond, g, 0.0)?, inputs[*i].shape())?);
                }
            }
            if let Side::Input(i) = on_false {
                if wants(*i) {
                    out[*i] = Some(sum_to(crate::tensor::where_(cond, 0.0, g)?, inputs[*i].shape())?);
                }
            }
        }
        GradOp::MatMul => {
            let (a, b) = (&inputs[0], &inputs[1]);
            let a2 = if a.rank() == 1 { a.unsqueeze(0)? } else { a.clone() };
            let b2 = if b.rank() == 1 { b.unsqueeze(-1)? } else { b.clone() };
            let promoted =
                shape::matmul_type(a2.ty(), b2.ty()).map_err(|source| TensorError::Type { op: "matmul", source })?;
            let g2 = reshaped(g.clone(), promoted.shape.dims())?;
            if wants(0) {
                out[0] = Some(reshaped(sum_to(g2.matmul(&b2.t()?)?, a2.shape())?, a.shape())?);
            }
            if wants(1) {
                out[1] = Some(reshaped(sum_to(a2.t()?.matmul(&g2)?, b2.shape())?, b.shape())?);
            }
        }
        GradOp::Reduce { op, axes, keepdim } => {
            let a = &inputs[0];
            let rank = a.rank();
            let axes: Vec<usize> = match axes {
                Some(ax) => {
                    shape::normalize_axes(ax, rank).map_err(|source| TensorError::Type { op: node.name, source })?
                }
                None => (0..rank).collect(),
            };
            let mut kept = dims_i64(a.shape());
            for &ax in &axes {
                kept[ax] = 1;
            }
            let gk = if *keepdim { g.clone() } else { g.reshape(&kept)? };
            out[0] = Some(match op {
                ReduceOp::Sum => gk.broadcast_to(a.shape())?,
                ReduceOp::Mean => {
                    let count: usize = axes.iter().map(|&ax| a.shape()[ax]).product();
                    gk.mul(1.0 / count.max(1) as f64)?.broadcast_to(a.shape())?
                }
                ReduceOp::Max | ReduceOp::Min => {
                    let y = node.output()?;
                    let yk = if *keepdim { y } else { y.reshape(&kept)? };
                    let mask = a.eq(&yk)?;
                    let ties = mask.sum_dims(&axes.iter().map(|&x| x as i64).collect::<Vec<_>>(), true)?;
                    mask.mul(&gk.div(&ties)?)?
                }
            });
        }
        GradOp::Transpose { dim0, dim1 } => out[0] = Some(g.transpose(*dim0, *dim1)?),
        GradOp::Permute { perm } => {
            let rank = inputs[0].rank();
            let mut inverse = vec![0i64; rank];
            for (i, &p) in perm.iter().enumerate() {
                let p = shape::normalize_axis(p, rank).map_err(|source| TensorError::Type { op: "permute", source })?;
                inverse[p] = i as i64;
            }
            out[0] = Some(g.permute(&inverse)?);
        }
        GradOp::Reshape => out[0] = Some(reshaped(g.clone(), inputs[0].shape())?),
        GradOp::Cast => out[0] = Some(g.to(inputs[0].dtype())?),
        GradOp::BroadcastTo => out[0] = Some(sum_to(g.clone(), inputs[0].shape())?),
        GradOp::Slice { index } => out[0] = Some(slice_grad(g, inputs[0].shape(), index)?),
        GradOp::Concat { axis } => {
            let ax =
                shape::normalize_axis(*axis, g.rank()).map_err(|source| TensorError::Type { op: "concat", source })?;
            let sizes: Vec<usize> = inputs.iter().map(|t| t.shape()[ax]).collect();
            let pieces = g.split_sizes(&sizes, *axis)?;
            for (i, p) in pieces.into_iter().enumerate() {
                if wants(i) {
                    out[i] = Some(p);
                }
            }
        }
        GradOp::SplitPiece { axis, start, len } => {
            let n = inputs[0].shape()[*axis];
            out[0] = Some(pad_axis(g.clone(), *axis, *start, n - start - len)?);
        }
    }
    for (i, o) in out.iter_mut().enumerate() {
        if !wants(i) {
            *o = None;
        }
    }
    Ok(out)
}

/// The recorded ops still alive and not yet used by a backward, in recording order.
pub(crate) fn live_tape(ctx: &Context) -> Vec<TapeEntry> {
    ctx.tape.borrow().iter().filter_map(|w| w.upgrade()).filter(|n| !n.is_released()).map(|n| n.entry()).collect()
}
