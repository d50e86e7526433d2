//! The checks every backend makes before it computes an instruction, so that all backends
//! refuse the same streams with the same errors: undefined operands, absurd operands the
//! type rules must not see, the type rules themselves, and the limits on result sizes.

use crate::RuntimeError;
use gt_ir::verify::shape::{self, MAX_ELEMENTS};
use gt_ir::{Instr, Shape, SliceItem, SplitSpec, TensorType, TypeError, ValueId};
use std::borrow::Cow;

/// Bytes per element of `f32`, the dtype kernels compute in.
pub const ELEMENT_BYTES: usize = std::mem::size_of::<f32>();

/// Checks `instr` against the types of the live values (`type_of`) and the per-tensor byte
/// limit; returns the instruction to compute (possibly with clamped fields) and its result
/// types.
pub fn prepare<'i>(
    instr: &'i Instr,
    type_of: &dyn Fn(ValueId) -> Result<TensorType, TypeError>,
    max_tensor_bytes: usize,
) -> Result<(Cow<'i, Instr>, shape::ResultTypes), RuntimeError> {
    let op = instr.mnemonic();
    let checked = || {
        let instr = guard(instr, type_of, max_tensor_bytes)?;
        let types = shape::infer(&instr, type_of).map_err(|source| RuntimeError::Type { op, source })?;
        for ty in &types {
            check_result(op, &ty.shape, max_tensor_bytes)?;
        }
        Ok((instr, types))
    };
    let result = checked();
    if result.is_err() {
        // An undefined operand is reported as such rather than as the type error it caused
        // (looked for only on failure: each look builds a type, an allocation per operand).
        for value in instr.operands() {
            type_of(value).map_err(|_| RuntimeError::Undefined { op, value })?;
        }
    }
    result
}

/// Refuses, naming `backend`, a matmul whose operands are not `f32`, `f16` or `bf16`: what a
/// backend whose products compute in `f32` (tensor cores or FMA tiles) checks after
/// [`prepare`]. Every other op computes in any dtype ([`gt_ir::kernel::Compute`]).
pub fn products_of_floats(
    instr: &Instr,
    backend: &'static str,
    type_of: &dyn Fn(ValueId) -> Result<TensorType, TypeError>,
) -> Result<(), RuntimeError> {
    if !matches!(instr, Instr::MatMul { .. }) {
        return Ok(());
    }
    let float32 = |d: gt_ir::DType| gt_ir::kernel::Compute::of(d) == gt_ir::kernel::Compute::F32;
    only(instr, &[], (backend, type_of), float32)
}

/// The first operand or result dtype `takes` refuses, as an error naming `backend`.
fn only(
    instr: &Instr,
    types: &[TensorType],
    (backend, type_of): (&'static str, &dyn Fn(ValueId) -> Result<TensorType, TypeError>),
    takes: impl Fn(gt_ir::DType) -> bool,
) -> Result<(), RuntimeError> {
    let operands = instr.operands().into_iter().filter_map(|v| type_of(v).ok().map(|t| t.dtype));
    match types.iter().map(|t| t.dtype).chain(operands).find(|&d| !takes(d)) {
        Some(dtype) => Err(RuntimeError::BackendDType { op: instr.mnemonic(), backend, dtype }),
        None => Ok(()),
    }
}

/// Keeps the type rules themselves safe on absurd operands, before they run.
fn guard<'i>(
    instr: &'i Instr,
    type_of: &dyn Fn(ValueId) -> Result<TensorType, TypeError>,
    max_tensor_bytes: usize,
) -> Result<Cow<'i, Instr>, RuntimeError> {
    // Every live axis is at most 2^40 long (`check_result`), so any slice step larger
    // than that selects the same single element; clamping it keeps the slice
    // arithmetic of `resolve_slice` far from i64 overflow.
    const MAX_STEP: i64 = MAX_ELEMENTS as i64;
    match instr {
        Instr::Slice { dst, src, index }
            if index
                .iter()
                .any(|i| matches!(i, SliceItem::Range { step, .. } if step.unsigned_abs() > MAX_STEP as u64)) =>
        {
            let index = index
                .iter()
                .map(|&item| match item {
                    SliceItem::Range { start, end, step } => {
                        SliceItem::Range { start, end, step: step.clamp(-MAX_STEP, MAX_STEP) }
                    }
                    other => other,
                })
                .collect();
            Ok(Cow::Owned(Instr::Slice { dst: *dst, src: *src, index }))
        }
        Instr::Split { src, axis, spec, .. } => {
            // `split_sizes` lists every piece before it compares the count with the
            // results named, so bound that list like any other allocation.
            let op = instr.mnemonic();
            let dims = type_of(*src).map_err(|_| RuntimeError::Undefined { op, value: *src })?.shape.0;
            if let Ok(axis) = shape::normalize_axis(*axis, dims.len()) {
                let len = dims[axis];
                let pieces = match spec {
                    SplitSpec::Size(n) => len / (*n).max(1) + 1,
                    SplitSpec::Chunks(c) => (*c).min(len) + 1,
                    SplitSpec::Sizes(_) => 0,
                };
                let bytes = pieces.saturating_mul(std::mem::size_of::<usize>());
                if bytes > max_tensor_bytes {
                    return Err(RuntimeError::TooLarge { op, bytes, limit: max_tensor_bytes });
                }
            }
            Ok(Cow::Borrowed(instr))
        }
        _ => Ok(Cow::Borrowed(instr)),
    }
}

/// Checks a result fits the memory limit and can be addressed.
fn check_result(op: &'static str, shape: &Shape, max_tensor_bytes: usize) -> Result<(), RuntimeError> {
    let bytes = shape.checked_numel().and_then(|n| n.checked_mul(ELEMENT_BYTES)).unwrap_or(usize::MAX);
    if bytes > max_tensor_bytes {
        return Err(RuntimeError::TooLarge { op, bytes, limit: max_tensor_bytes });
    }
    // An empty tensor needs no bytes but may still name absurd dimensions, which would
    // overflow the type rules' arithmetic (concat sums, slice bounds) and ndarray's
    // checks; bounding the nonzero ones keeps every later step in range.
    let extent = shape.dims().iter().filter(|&&d| d != 0).try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if !matches!(extent, Some(e) if e <= MAX_ELEMENTS) {
        return Err(RuntimeError::Extent { op, shape: shape.clone() });
    }
    Ok(())
}
