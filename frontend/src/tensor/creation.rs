//! Tensor creation on the current context: random, constant, ranges and host data.

use super::{Context, Result, Tensor, TensorError};
use gt_ir::data::Elements;
use gt_ir::{DType, Instr, TensorType, ValueId};
use std::rc::Rc;

/// Runs a creation instruction (no operands) on `ctx`.
pub(crate) fn create(ctx: &Rc<Context>, make: impl FnOnce(ValueId) -> Instr) -> Result<Tensor> {
    let dst = ctx.fresh_id();
    let instr = make(dst);
    let op = instr.mnemonic();
    let ty = gt_ir::verify::shape::infer(&instr, &|v| Err(gt_ir::TypeError::UnknownValue(v)))
        .map_err(|source| TensorError::Type { op, source })?
        .remove(0);
    ctx.submit_owned(instr)?;
    Ok(Tensor::wrap(ctx.clone(), dst, ty, None))
}

fn f32_type(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// Standard-normal values (seeded from the context's sequence: [`super::manual_seed`]).
pub fn randn(shape: &[usize]) -> Result<Tensor> {
    randn_seeded(shape, Context::current()?.next_seed())
}

/// Standard-normal values from a given seed (what `.gtir`'s `randn ... seed=N` gives).
pub fn randn_seeded(shape: &[usize], seed: u64) -> Result<Tensor> {
    let ctx = Context::current()?;
    create(&ctx, |dst| Instr::Randn { dst, ty: f32_type(shape), seed })
}

/// Uniform values in `[0, 1)` from a given seed.
pub fn rand_seeded(shape: &[usize], seed: u64) -> Result<Tensor> {
    let ctx = Context::current()?;
    create(&ctx, |dst| Instr::Rand { dst, ty: f32_type(shape), seed })
}

/// Uniform values in `[0, 1)`.
pub fn rand(shape: &[usize]) -> Result<Tensor> {
    rand_seeded(shape, Context::current()?.next_seed())
}

/// All zeros.
pub fn zeros(shape: &[usize]) -> Result<Tensor> {
    zeros_of(&Context::current()?, f32_type(shape))
}

pub(crate) fn zeros_of(ctx: &Rc<Context>, ty: TensorType) -> Result<Tensor> {
    create(ctx, |dst| Instr::Zeros { dst, ty })
}

pub(crate) fn ones_of(ctx: &Rc<Context>, ty: TensorType) -> Result<Tensor> {
    create(ctx, |dst| Instr::Ones { dst, ty })
}

/// All ones.
pub fn ones(shape: &[usize]) -> Result<Tensor> {
    let ctx = Context::current()?;
    create(&ctx, |dst| Instr::Ones { dst, ty: f32_type(shape) })
}

/// Every element `value`.
pub fn full(shape: &[usize], value: f64) -> Result<Tensor> {
    let ctx = Context::current()?;
    create(&ctx, |dst| Instr::Full { dst, ty: f32_type(shape), value })
}

/// `start, start+step, ..` below `end` (1-d).
pub fn arange(start: f64, end: f64, step: f64) -> Result<Tensor> {
    let ctx = Context::current()?;
    create(&ctx, |dst| Instr::Arange { dst, dtype: DType::F32, start, end, step })
}

/// A tensor of this shape from row-major data (`data.len()` must be the element count).
pub fn from_vec(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
    from_data(data, shape)
}

/// A tensor of any dtype from row-major data: `from_data(vec![1i64, 2], &[2])` is an `i64`
/// tensor, `from_data(vec![true, false], &[2])` a `bool` one.
pub fn from_data(data: impl Into<Elements>, shape: &[usize]) -> Result<Tensor> {
    let data = data.into();
    let ctx = Context::current()?;
    let ty = TensorType::new(data.dtype(), shape.to_vec());
    create(&ctx, |dst| Instr::Literal { dst, ty, data })
}

/// Zeros of a dtype.
pub fn zeros_dtype(shape: &[usize], dtype: DType) -> Result<Tensor> {
    full_dtype(shape, 0.0, dtype)
}

/// Every element `value`, of a dtype (`value` must be one of its elements).
pub fn full_dtype(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
    let ctx = Context::current()?;
    create(&ctx, |dst| Instr::Full { dst, ty: TensorType::new(dtype, shape.to_vec()), value })
}

/// `start, start+step, ..` below `end` (1-d), of a dtype (`arange_dtype(0.0, 5.0, 1.0,
/// DType::I64)` is PyTorch's `torch.arange(5)`).
pub fn arange_dtype(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
    let ctx = Context::current()?;
    create(&ctx, |dst| Instr::Arange { dst, dtype, start, end, step })
}

/// A 1-d tensor of these values.
pub fn tensor(data: &[f32]) -> Result<Tensor> {
    from_vec(data.to_vec(), &[data.len()])
}

/// A 0-d tensor.
pub fn scalar(value: f32) -> Result<Tensor> {
    from_vec(vec![value], &[])
}
