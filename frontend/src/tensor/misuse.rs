//! `Misuse`: the wrong uses of the Tensor API that the IR's type rules do not see (autograd,
//! in-place updates, signals, tensors of two runtimes), each [`super::TensorError::Invalid`].

use gt_ir::{TensorType, ValueId};
use thiserror::Error;

/// What was wrong with a call (the op or method is named by the [`super::TensorError`]).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum Misuse {
    /// `cross_entropy` of operands that are not `[N, C]` of one shape.
    #[error("expects logits [N, C] and targets of the same shape, got {logits} and {target}")]
    CrossEntropyShapes {
        /// The logits' type.
        logits: Box<TensorType>,
        /// The targets' type.
        target: Box<TensorType>,
    },
    /// `one_hot` of a label outside the classes.
    #[error("label {label} is not below the class count {classes}")]
    LabelOutOfRange {
        /// The label.
        label: usize,
        /// The class count.
        classes: usize,
    },
    /// A gradient needs an op's result, which was dropped.
    #[error("the result of `{op}` is gone")]
    ResultGone {
        /// The op.
        op: &'static str,
    },
    /// A value an op's gradient needs was changed in place after the op read it.
    #[error("{what} of `{op}` was modified in place after `{op}` used it; its gradient would be wrong")]
    ModifiedInPlace {
        /// The op.
        op: &'static str,
        /// Which value (`its result`, `operand 1`).
        what: &'static str,
    },
    /// `backward()` of a loss with other than one element.
    #[error("the loss must have one element, not {numel} ({ty}); use backward_with(grad) otherwise")]
    LossNotScalar {
        /// Its elements.
        numel: usize,
        /// Its type.
        ty: Box<TensorType>,
    },
    /// `backward` of a tensor outside the graph.
    #[error("the tensor does not require grad (no input of it requires grad, or it was computed under no_grad)")]
    NoGrad,
    /// `backward_with` a gradient of another type than the tensor's.
    #[error("the gradient has type {grad}, the tensor {tensor}")]
    GradType {
        /// The gradient's type.
        grad: Box<TensorType>,
        /// The tensor's.
        tensor: Box<TensorType>,
    },
    /// A second `backward` through a freed graph.
    #[error("the graph through `{op}` was already used by a backward and freed; run the forward again")]
    GraphFreed {
        /// The op whose node was freed.
        op: &'static str,
    },
    /// A gradient formula naming an operand the op does not have (a bug in the op table).
    #[error("a gradient formula of `{op}` reads a missing operand")]
    FormulaOperand {
        /// The op.
        op: &'static str,
    },
    /// A signal with an empty name.
    #[error("a signal needs a name")]
    UnnamedSignal,
    /// `signal::exit` of a signal that is not the innermost open one.
    #[error("exit({name:?}) while {innermost:?} is the innermost open signal")]
    SignalNotInnermost {
        /// The signal exited.
        name: String,
        /// The innermost open one.
        innermost: String,
    },
    /// `signal::exit` with no signal open.
    #[error("exit({name:?}) with no open signal")]
    NoOpenSignal {
        /// The signal exited.
        name: String,
    },
    /// An operand the local executor does not hold.
    #[error("an operand is not defined (or was freed)")]
    UndefinedOperand,
    /// A gradient asked for where there is none.
    #[error("the value has no gradient: it must be a leaf marked with requires_grad that a backward reached since it was last updated (sgd and adam clear gradients)")]
    NoGradient,
    /// An optimizer operand that is not a parameter.
    #[error("operand {operand} is not a parameter: mark it with requires_grad first")]
    NotParameter {
        /// The operand (1-based).
        operand: usize,
    },
    /// Tensors of two runtimes in one op.
    #[error("Tensor({tensor}: {ty}) belongs to another runtime than Tensor({first}: {first_ty}); tensors of two runtimes cannot meet")]
    OtherRuntime {
        /// The tensor of the other runtime.
        tensor: ValueId,
        /// Its type.
        ty: Box<TensorType>,
        /// The first operand.
        first: ValueId,
        /// Its type.
        first_ty: TensorType,
    },
    /// A binary op of two scalars.
    #[error("needs at least one tensor operand")]
    NoTensorOperand,
    /// An instruction operand beyond the tensors given ([`super::apply_instr`]).
    #[error("operand {operand} is not one of the {given} tensors given")]
    OperandNotGiven {
        /// The operand.
        operand: ValueId,
        /// Tensors given.
        given: usize,
    },
    /// An autocast dtype that is not a half or `f32`.
    #[error("takes bf16, f16 or f32 (off), not {dtype}")]
    AutocastDType {
        /// The dtype asked for.
        dtype: gt_ir::DType,
    },
    /// An instruction that is not a tensor op ([`super::apply_instr`]).
    #[error("is not a tensor op (compiled kernels, frees, reads and markers belong to the runtime)")]
    NotATensorOp,
    /// A read answered with a value of another type than the tensor's.
    #[error("the runtime answered a {answered} value for this {tensor} tensor")]
    AnswerType {
        /// The answer's type.
        answered: TensorType,
        /// The tensor's.
        tensor: Box<TensorType>,
    },
    /// `item()` of a tensor with other than one element.
    #[error("the tensor has {numel} elements, not one ({ty})")]
    NotOneElement {
        /// Its elements.
        numel: usize,
        /// Its type.
        ty: Box<TensorType>,
    },
    /// `requires_grad_(true)` of an integer or `bool` tensor, through which no gradient
    /// flows (PyTorch refuses it too).
    #[error("only tensors of a floating-point dtype can require gradients, not {dtype}")]
    NotFloat {
        /// The tensor's dtype.
        dtype: gt_ir::DType,
    },
    /// `requires_grad_` of a computed tensor.
    #[error("only a leaf (a tensor not computed by a recorded op) can change requires_grad; detach() gives one")]
    NotLeaf,
    /// An in-place update that changes the type.
    #[error("an in-place update must keep the type {tensor}; the update gives {update}")]
    UpdateType {
        /// The tensor's type.
        tensor: Box<TensorType>,
        /// The update's.
        update: TensorType,
    },
    /// An in-place update by a value that requires grad.
    #[error("the update requires grad, and an in-place update cannot carry a gradient: write `x = x.add(&y)?` (or update inside gt::no_grad())")]
    UpdateRequiresGrad,
    /// An in-place update by a tensor of another runtime.
    #[error("the tensors belong to different runtimes")]
    DifferentRuntimes,
    /// An in-place update of a tensor that requires grad, outside `no_grad`.
    #[error("a tensor that requires grad can only be updated in place inside gt::no_grad() (as optimizers do)")]
    InPlaceWithGrad,
    /// A layer norm over a shape the input does not end with.
    #[error("normalizes over the last axes of shape {normalized:?}, but the input has shape {input:?}")]
    NormalizedShape {
        /// The shape the layer normalizes over.
        normalized: Vec<usize>,
        /// The input's shape.
        input: Vec<usize>,
    },
    /// A `gt!` statement naming another number of results than the op gives.
    #[error("gives {found} results here, but the `gt!` statement names {named}")]
    ResultCount {
        /// Results the op gives.
        found: usize,
        /// Names in the statement.
        named: usize,
    },
}
