//! The Rust Tensor API: [`Tensor`], a handle to a value held by the workers. Every op lowers
//! to one IR instruction (the same ones `.gtir` scripts use), is typed on the client with the
//! verifier's rules (a shape error is an `Err` naming the op at the call, not a late failure)
//! and is queued without waiting; only reads (`to_vec`, `item`) wait. Dropping the last handle
//! frees the value remotely.
//!
//! Methods return `Result<Tensor, TensorError>`. The operators `+ - * /` and unary `-` cannot
//! return a `Result` and stay pleasant, so they panic with the same error instead: use the
//! methods (`a.add(&b)?`) where a failure must be handled.

pub mod autocast;
mod context;
mod creation;
mod exec;
mod misuse;
mod operators;
mod ops;

pub use context::{
    is_grad_enabled, manual_seed, no_grad, Context, ContextGuard, DynExecutor, ExecFailure, NoGradGuard,
};
pub use creation::{
    arange, arange_dtype, from_data, from_vec, full, full_dtype, ones, rand, rand_seeded, randn, randn_seeded, scalar,
    tensor, zeros, zeros_dtype,
};
pub(crate) use creation::{ones_of, zeros_of as creation_zeros};
pub use exec::TensorExecutor;
pub use misuse::Misuse;
pub use ops::binary;
pub use ops::{apply_instr, cat, where_};

use crate::autograd::GradNode;
use gt_ir::{DType, FailureKind, HostTensor, SliceItem, TensorType, TypeError, ValueId};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;
use thiserror::Error;

/// Why a tensor operation failed.
#[derive(Debug, Error)]
pub enum TensorError {
    /// The operands do not fit the op (shapes, axes, counts): found on the client.
    #[error("{op}: {source}")]
    Type {
        /// The op.
        op: &'static str,
        /// The type rule that failed.
        source: TypeError,
    },
    /// A bad argument or use that the IR does not see (autograd, empty lists, ...).
    #[error("{op}: {misuse}")]
    Invalid {
        /// The op or method.
        op: &'static str,
        /// What is wrong.
        #[source]
        misuse: Misuse,
    },
    /// The dispatcher or a worker reported a failure (for late reports, `op` is the
    /// instruction that failed, which may be earlier than the call).
    #[error("{op} failed: {executor_message}")]
    Exec {
        /// The op.
        op: &'static str,
        /// What kind of failure (out of memory, a lost worker, ...).
        kind: FailureKind,
        /// Why, as the executor said: text from a worker or dispatcher over the wire (or a
        /// local executor's error, displayed the same way so both read alike).
        executor_message: String,
    },
    /// No context on this thread.
    #[error("no gt runtime on this thread: start one first (gt::init(), or gt::Runtime::embedded/connect/reference)")]
    NoRuntime,
    /// The tensor's runtime was shut down.
    #[error("the gt runtime this tensor belongs to was shut down")]
    Closed,
}

impl TensorError {
    /// What kind of failure: the executor's for [`TensorError::Exec`], [`FailureKind::Type`]
    /// for errors found on the client (types, bad arguments), [`FailureKind::Connection`] when
    /// there is no runtime.
    pub fn kind(&self) -> FailureKind {
        match self {
            TensorError::Exec { kind, .. } => *kind,
            TensorError::Type { source, .. } => source.kind(),
            TensorError::Invalid { .. } => FailureKind::Type,
            TensorError::NoRuntime | TensorError::Closed => FailureKind::Connection,
        }
    }

    pub(crate) fn invalid(op: &'static str, misuse: Misuse) -> TensorError {
        TensorError::Invalid { op, misuse }
    }
}

/// Results of tensor operations.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;

/// A remote value: its id, freed when the last holder drops it.
pub(crate) struct Value {
    pub(crate) id: ValueId,
    pub(crate) ctx: Rc<Context>,
}

impl Drop for Value {
    fn drop(&mut self) {
        self.ctx.free(self.id);
    }
}

pub(crate) struct Inner {
    /// Replaced by in-place updates (`sub_assign`, `zero_`); `version` counts them.
    pub(crate) value: RefCell<Rc<Value>>,
    pub(crate) ty: TensorType,
    pub(crate) version: Cell<u64>,
    pub(crate) requires_grad: Cell<bool>,
    /// The op that made it, when it was recorded for autograd (`None`: a leaf).
    pub(crate) grad_fn: Option<Rc<GradNode>>,
    pub(crate) grad: RefCell<Option<Tensor>>,
}

/// A handle to a tensor held by the workers. Cloning shares it (like `Rc`); the value is
/// freed when the last handle (and the last autograd node needing it) is dropped.
#[derive(Clone)]
pub struct Tensor(pub(crate) Rc<Inner>);

/// The right operand of a binary op: a tensor or a scalar (`x.mul(0.5)`, `x.add(&y)`).
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    /// A tensor.
    Tensor(&'a Tensor),
    /// A scalar of the tensor's dtype, broadcast.
    Scalar(f64),
}

impl<'a> From<&'a Tensor> for Arg<'a> {
    fn from(t: &'a Tensor) -> Arg<'a> {
        Arg::Tensor(t)
    }
}

macro_rules! scalar_arg {
    ($($t:ty),*) => {$(
        impl From<$t> for Arg<'_> {
            fn from(x: $t) -> Self {
                Arg::Scalar(x as f64)
            }
        }
    )*};
}
scalar_arg!(f32, f64, i32, i64, u32, usize);

impl Tensor {
    pub(crate) fn wrap(ctx: Rc<Context>, id: ValueId, ty: TensorType, grad_fn: Option<Rc<GradNode>>) -> Tensor {
        let requires_grad = grad_fn.is_some();
        Tensor(Rc::new(Inner {
            value: RefCell::new(Rc::new(Value { id, ctx })),
            ty,
            version: Cell::new(0),
            requires_grad: Cell::new(requires_grad),
            grad_fn,
            grad: RefCell::new(None),
        }))
    }

    /// The value's id in this client's stream (what the instruction log and dumps show).
    pub fn id(&self) -> ValueId {
        self.0.value.borrow().id
    }

    pub(crate) fn ctx(&self) -> Rc<Context> {
        self.0.value.borrow().ctx.clone()
    }

    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        self.0.ty.shape.dims()
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.ty.shape.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.ty.shape.numel()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.ty.dtype
    }

    /// Dtype and shape.
    pub fn ty(&self) -> &TensorType {
        &self.0.ty
    }

    /// The values, row-major, as `f32`s whatever the dtype (a sync point: waits for
    /// everything before it). [`Tensor::to_host`] gives them in their own dtype.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        Ok(self.to_host()?.data.into_f32())
    }

    /// Type and values (a sync point).
    pub fn to_host(&self) -> Result<HostTensor> {
        let host = self.ctx().fetch(self.id())?;
        // The tensor's type is known here: an answer of another type is not its value.
        if host.ty != self.0.ty {
            let why = Misuse::AnswerType { answered: host.ty, tensor: Box::new(self.0.ty.clone()) };
            return Err(TensorError::invalid("get", why));
        }
        Ok(host)
    }

    /// The one value of a one-element tensor (a sync point).
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(TensorError::invalid(
                "item",
                Misuse::NotOneElement { numel: self.numel(), ty: Box::new(self.0.ty.clone()) },
            ));
        }
        Ok(self.to_vec()?[0])
    }

    /// Whether gradients flow to (or through) it.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.get()
    }

    /// Whether it was made by the user (not by a recorded op): only leaves keep a gradient.
    pub fn is_leaf(&self) -> bool {
        self.0.grad_fn.is_none()
    }

    /// Makes a leaf track gradients (or stop). Fails on a non-leaf, whose flag follows its
    /// inputs (use [`Tensor::detach`] for a leaf copy).
    pub fn requires_grad_(self, on: bool) -> Result<Tensor> {
        if !self.is_leaf() {
            return Err(TensorError::invalid("requires_grad_", Misuse::NotLeaf));
        }
        if on && !self.dtype().is_float() {
            return Err(TensorError::invalid("requires_grad_", Misuse::NotFloat { dtype: self.dtype() }));
        }
        self.0.requires_grad.set(on);
        Ok(self)
    }

    /// The accumulated gradient of a leaf, after `backward` (`None` before, after
    /// `zero_grad`, and always for non-leaves).
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad.borrow().clone()
    }

    /// Forgets the accumulated gradient (PyTorch's `set_to_none`).
    pub fn zero_grad(&self) {
        *self.0.grad.borrow_mut() = None;
    }

    pub(crate) fn set_grad(&self, g: Option<Tensor>) {
        *self.0.grad.borrow_mut() = g;
    }

    /// A leaf sharing this value, outside the graph (no gradient flows through it).
    pub fn detach(&self) -> Tensor {
        Tensor(Rc::new(Inner {
            value: RefCell::new(self.0.value.borrow().clone()),
            ty: self.0.ty.clone(),
            version: Cell::new(0),
            requires_grad: Cell::new(false),
            grad_fn: None,
            grad: RefCell::new(None),
        }))
    }

    /// Replaces the value with `new` (same type), counting an in-place update.
    fn replace_value(&self, op: &'static str, new: Tensor) -> Result<()> {
        if new.0.ty != self.0.ty {
            let misuse = Misuse::UpdateType { tensor: Box::new(self.0.ty.clone()), update: new.0.ty.clone() };
            return Err(TensorError::invalid(op, misuse));
        }
        let value = new.0.value.borrow().clone();
        *self.0.value.borrow_mut() = value;
        self.0.version.set(self.0.version.get() + 1);
        Ok(())
    }

    /// An in-place update cannot carry a gradient: refuse a source that needs one.
    fn check_untracked_source(&self, op: &'static str, src: &Tensor) -> Result<()> {
        if src.requires_grad() && src.ctx().is_grad_enabled() {
            return Err(TensorError::invalid(op, Misuse::UpdateRequiresGrad));
        }
        if !Rc::ptr_eq(&src.ctx(), &self.ctx()) {
            return Err(TensorError::invalid(op, Misuse::DifferentRuntimes));
        }
        Ok(())
    }

    fn check_in_place(&self, op: &'static str) -> Result<()> {
        if self.requires_grad() && self.ctx().is_grad_enabled() {
            return Err(TensorError::invalid(op, Misuse::InPlaceWithGrad));
        }
        Ok(())
    }

    /// `self = self op rhs` in place (the handle keeps its identity; every clone sees it).
    fn update(&self, op: &'static str, with: gt_ir::BinaryOp, rhs: Arg<'_>) -> Result<()> {
        self.check_in_place(op)?;
        if let Arg::Tensor(t) = rhs {
            self.check_untracked_source(op, t)?;
        }
        let new = ops::binary(with, Arg::Tensor(&self.detach()), rhs)?;
        self.replace_value(op, new)
    }

    /// `self -= rhs` in place (the handle keeps its identity; every clone sees the update).
    pub fn sub_assign<'a>(&self, rhs: impl Into<Arg<'a>>) -> Result<()> {
        self.update("sub_assign", gt_ir::BinaryOp::Sub, rhs.into())
    }

    /// `self += rhs` in place.
    pub fn add_assign<'a>(&self, rhs: impl Into<Arg<'a>>) -> Result<()> {
        self.update("add_assign", gt_ir::BinaryOp::Add, rhs.into())
    }

    /// `self *= rhs` in place.
    pub fn mul_assign<'a>(&self, rhs: impl Into<Arg<'a>>) -> Result<()> {
        self.update("mul_assign", gt_ir::BinaryOp::Mul, rhs.into())
    }

    /// `self /= rhs` in place.
    pub fn div_assign<'a>(&self, rhs: impl Into<Arg<'a>>) -> Result<()> {
        self.update("div_assign", gt_ir::BinaryOp::Div, rhs.into())
    }

    /// Takes `src`'s value (same type) in place.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        self.check_in_place("assign")?;
        self.check_untracked_source("assign", src)?;
        self.replace_value("assign", src.detach())
    }

    /// Sets every element to zero in place.
    pub fn zero_(&self) -> Result<()> {
        self.check_in_place("zero_")?;
        let z = creation::zeros_of(&self.ctx(), self.0.ty.clone())?;
        self.replace_value("zero_", z)
    }

    /// How many in-place updates it has had (autograd refuses a gradient that needs an
    /// older value).
    pub fn version(&self) -> u64 {
        self.0.version.get()
    }

    /// Whether two handles are the same tensor.
    pub fn same(&self, other: &Tensor) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}: {}", self.id(), self.0.ty)?;
        if self.requires_grad() {
            write!(f, ", requires_grad")?;
        }
        if let Some(n) = &self.0.grad_fn {
            write!(f, ", grad_fn={}", n.name())?;
        }
        write!(f, ")")
    }
}

/// The values (a sync point), NumPy style: `f32[2, 2] [[1, 2], [3, 4]]`; a failure to read
/// prints as `<error: ..>` (use [`Tensor::to_vec`] to handle it).
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_host() {
            Ok(t) => write!(f, "{t}"),
            Err(e) => write!(f, "<error: {e}>"),
        }
    }
}

/// Builds a slice index NumPy style (an array of `SliceItem`s for [`Tensor::slice`]):
/// `s![.., 1..3, 0]`, `s![-1, NEW, ..]`; steps with [`step`] (`s![step(.., -1)]`) or
/// [`range_step`] (`2:0:-1` is `range_step(2, 0, -1)`).
#[macro_export]
macro_rules! s {
    ($($item:expr),* $(,)?) => {
        [$($crate::tensor::SliceArg::from($item).0),*]
    };
}

/// One item of [`s!`]: converted from `..`, `a..b`, `a..`, `..b`, an index, [`NEW`] or
/// [`ELLIPSIS`].
#[derive(Debug, Clone, Copy)]
pub struct SliceArg(pub SliceItem);

/// Inserts an axis of size 1 (NumPy's `None`).
pub const NEW: SliceArg = SliceArg(SliceItem::NewAxis);
/// As many full ranges as needed (NumPy's `...`).
pub const ELLIPSIS: SliceArg = SliceArg(SliceItem::Ellipsis);

/// A range with a step: `step(1..7, 2)`, `step(.., -1)`.
pub fn step(range: impl Into<SliceArg>, step: i64) -> SliceArg {
    match range.into().0 {
        SliceItem::Range { start, end, .. } => SliceArg(SliceItem::Range { start, end, step }),
        other => SliceArg(other),
    }
}

/// `start:end:step` (for backward ranges, which Rust's `a..b` cannot write).
pub fn range_step(start: i64, end: i64, step: i64) -> SliceArg {
    SliceArg(SliceItem::Range { start: Some(start), end: Some(end), step })
}

fn range(start: Option<i64>, end: Option<i64>) -> SliceArg {
    SliceArg(SliceItem::Range { start, end, step: 1 })
}

impl From<std::ops::RangeFull> for SliceArg {
    fn from(_: std::ops::RangeFull) -> SliceArg {
        range(None, None)
    }
}

macro_rules! slice_ints {
    ($($t:ty),*) => {$(
        impl From<$t> for SliceArg {
            fn from(i: $t) -> SliceArg {
                SliceArg(SliceItem::Index(i as i64))
            }
        }
        impl From<std::ops::Range<$t>> for SliceArg {
            fn from(r: std::ops::Range<$t>) -> SliceArg {
                range(Some(r.start as i64), Some(r.end as i64))
            }
        }
        impl From<std::ops::RangeFrom<$t>> for SliceArg {
            fn from(r: std::ops::RangeFrom<$t>) -> SliceArg {
                range(Some(r.start as i64), None)
            }
        }
        impl From<std::ops::RangeTo<$t>> for SliceArg {
            fn from(r: std::ops::RangeTo<$t>) -> SliceArg {
                range(None, Some(r.end as i64))
            }
        }
    )*};
}
slice_ints!(i32, i64, usize);
