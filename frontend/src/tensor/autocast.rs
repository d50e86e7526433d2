//! Mixed precision (PyTorch's `torch.autocast`): inside an autocast scope, matmuls and
//! elementwise arithmetic run in a half dtype (`bf16` or `f16`) while the parameters, their
//! gradients and the optimizer's state stay `f32` (master weights: a `cast` carries the
//! gradient back to them); reductions and transcendental functions run in `f32`, where half
//! precision loses too much. Scopes nest; `f32` turns autocast off inside an outer one. A
//! signal whose config says `dtype: bf16` opens one for its scope.

use super::{Misuse, Result, Tensor, TensorError};
use gt_ir::{BinaryOp, DType, UnaryOp};
use std::cell::RefCell;

thread_local! {
    static STACK: RefCell<Vec<DType>> = const { RefCell::new(Vec::new()) };
}

/// Whether `dtype` can be an autocast dtype: `bf16`, `f16`, or `f32` (off).
pub fn takes(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F16 | DType::F32)
}

/// Runs this thread's tensor ops in `dtype` until the guard drops (see the module docs).
pub fn autocast(dtype: DType) -> Result<AutocastGuard> {
    if !takes(dtype) {
        return Err(TensorError::invalid("autocast", Misuse::AutocastDType { dtype }));
    }
    STACK.with(|s| s.borrow_mut().push(dtype));
    Ok(AutocastGuard { _private: () })
}

/// Ends an autocast scope when dropped.
#[derive(Debug)]
#[must_use = "the autocast scope ends when the guard is dropped"]
pub struct AutocastGuard {
    _private: (),
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        STACK.with(|s| s.borrow_mut().pop());
    }
}

/// The half dtype ops run in now, if autocast is on: the innermost [`autocast`] guard's, or
/// else the innermost open signal's whose config names a `dtype`.
pub(crate) fn current() -> Option<DType> {
    STACK.with(|s| s.borrow().last().copied()).or_else(crate::signal::autocast_dtype).filter(|&d| d != DType::F32)
}

/// `t` as `dtype` when it is a float of another dtype (a cast with a gradient), else itself.
fn as_float(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype().is_float() && t.dtype() != dtype {
        t.to(dtype)
    } else {
        Ok(t.clone())
    }
}

/// A matmul's operands under autocast: both in the half dtype.
pub(crate) fn matmul_operands(lhs: &Tensor, rhs: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    match current() {
        Some(d) => Ok(Some((as_float(lhs, d)?, as_float(rhs, d)?))),
        None => Ok(None),
    }
}

/// A binary op's tensor operand under autocast: arithmetic runs in the half dtype (a float
/// operand of another dtype is cast); comparisons compare what they are given.
pub(crate) fn binary_operand(op: BinaryOp, t: &Tensor) -> Result<Option<Tensor>> {
    match current() {
        Some(d) if !op.is_comparison() && t.dtype().is_float() && t.dtype() != d => Ok(Some(t.to(d)?)),
        _ => Ok(None),
    }
}

/// A unary op's operand under autocast: transcendental functions run in `f32`, the rest
/// (`neg`, `abs`, `relu`) in the half dtype.
pub(crate) fn unary_operand(op: UnaryOp, t: &Tensor) -> Result<Option<Tensor>> {
    let Some(d) = current() else { return Ok(None) };
    let cheap = matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu);
    let want = if cheap { d } else { DType::F32 };
    if t.dtype().is_float() && t.dtype() != want {
        Ok(Some(t.to(want)?))
    } else {
        Ok(None)
    }
}

/// A reduction's operand under autocast: reductions run in `f32`.
pub(crate) fn reduce_operand(t: &Tensor) -> Result<Option<Tensor>> {
    match current() {
        Some(_) if t.dtype().is_half() => Ok(Some(t.to(DType::F32)?)),
        _ => Ok(None),
    }
}
