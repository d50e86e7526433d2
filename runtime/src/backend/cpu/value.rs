//! The interpreter's values of every dtype (`Value`) and the ops on dtypes other than `f32`:
//! `f32` keeps its fast, threaded functions in `interp.rs`; `f16`/`bf16` compute in `f32`
//! and round back (as PyTorch's CPU kernels do), elementwise ops tile by tile; `f64` computes in `f64`; integers in
//! `i64`, wrapping on overflow, then narrow; `bool` takes part in comparisons, `where`,
//! casts and the moves of data.

use super::interp::{self, Tensor};
use super::jit::{eager_by_tiles, Stored, StoredMut, Wide};
use super::typed;
use super::vmath::Halves;
use crate::cancel;
use gt_ir::data::{convert, Element, Elements};
use gt_ir::kernel::{Access, Compute, MapKernel, Node};
use gt_ir::ops::OpDef;
use gt_ir::{BinaryOp, DType, ReduceOp, UnaryOp};
use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn, Slice, Zip};

/// A value as the interpreter stores it: row-major contiguous, of its dtype.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    F64(ArrayD<f64>),
    F32(Tensor),
    F16(ArrayD<f16>),
    BF16(ArrayD<bf16>),
    I64(ArrayD<i64>),
    I32(ArrayD<i32>),
    Bool(ArrayD<bool>),
}

/// `$body` on the array inside a [`Value`], rewrapped in the same variant.
macro_rules! map_value {
    ($v:expr, $a:ident => $body:expr) => {
        match $v {
            Value::F64($a) => Value::F64($body),
            Value::F32($a) => Value::F32($body),
            Value::F16($a) => Value::F16($body),
            Value::BF16($a) => Value::BF16($body),
            Value::I64($a) => Value::I64($body),
            Value::I32($a) => Value::I32($body),
            Value::Bool($a) => Value::Bool($body),
        }
    };
}

/// `$body` on the array inside a [`Value`], whatever it gives.
macro_rules! with_value {
    ($v:expr, $a:ident => $body:expr) => {
        match $v {
            Value::F64($a) => $body,
            Value::F32($a) => $body,
            Value::F16($a) => $body,
            Value::BF16($a) => $body,
            Value::I64($a) => $body,
            Value::I32($a) => $body,
            Value::Bool($a) => $body,
        }
    };
}
pub(crate) use map_value;

/// `$body` with `$T` the element type of `$dtype`, giving a [`Value`] built by `$wrap`.
macro_rules! by_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F64 => {
                type $T = f64;
                Value::F64($body)
            }
            DType::F32 => {
                type $T = f32;
                Value::F32($body)
            }
            DType::F16 => {
                type $T = f16;
                Value::F16($body)
            }
            DType::BF16 => {
                type $T = bf16;
                Value::BF16($body)
            }
            DType::I64 => {
                type $T = i64;
                Value::I64($body)
            }
            DType::I32 => {
                type $T = i32;
                Value::I32($body)
            }
            DType::Bool => {
                type $T = bool;
                Value::Bool($body)
            }
        }
    };
}

/// An element type's array from row-major data whose length the type rule checked.
pub(crate) fn array<T>(dims: &[usize], data: Vec<T>) -> ArrayD<T> {
    ArrayD::from_shape_vec(IxDyn(dims), data).expect("the type rule fixed the element count")
}

/// `a` stretched to `dims` (the type rule checked they broadcast): one element filled, a
/// row-major `a` repeated along leading axes copied whole (a bias, a gradient of a sum), the
/// rest through `ndarray`'s strided walk, which goes an element at a time.
fn stretched<T: Copy>(a: &ArrayD<T>, dims: &[usize]) -> ArrayD<T> {
    if let (1, Some(&x)) = (a.len(), a.iter().next()) {
        return ArrayD::from_elem(IxDyn(dims), x);
    }
    // `a`'s shape without its leading ones, and the result's leading axes that repeat it.
    let core = &a.shape()[a.shape().iter().take_while(|&&d| d == 1).count()..];
    let lead = dims.len().saturating_sub(core.len());
    if let (Some(v), true) = (a.as_slice(), core == &dims[lead..]) {
        return array(dims, v.repeat(dims[..lead].iter().product()));
    }
    a.broadcast(dims).expect("the type rule checked the shapes broadcast").to_owned()
}

/// `bool`s as `f32` 0 or 1, in the host's widest vectors: a mask widened for arithmetic
/// (`g * (x > 0)`, relu's gradient).
fn mask_f32(a: &ArrayD<bool>) -> Tensor {
    let a = a.as_standard_layout();
    let bits = a.as_slice().expect("standard layout");
    array(a.shape(), super::vmath::wide(|| bits.iter().map(|&b| f32::from(u8::from(b))).collect()))
}

/// Element-by-element conversion of an array (see [`convert`]).
fn converted<S: Element, T: Element>(a: &ArrayD<S>) -> ArrayD<T> {
    let a = a.as_standard_layout();
    let data = a.as_slice().map_or_else(|| convert(&a.iter().copied().collect::<Vec<_>>()), convert);
    array(a.shape(), data)
}

/// Halves as `f32` (exact, [`Halves::widen`]): what every op on halves and every `fused`
/// kernel reading them pays.
fn widened<H: Element + Halves>(a: &ArrayD<H>) -> Tensor {
    let a = a.as_standard_layout();
    let halves = a.as_slice().expect("standard layout");
    let mut out = vec![0.0f32; halves.len()];
    H::widen(halves, &mut out);
    array(a.shape(), out)
}

/// `f32`s rounded to nearest even halves (the other way of [`widened`]).
fn narrowed<H: Element + Default + Halves>(a: &Tensor) -> ArrayD<H> {
    let a = a.as_standard_layout();
    let floats = a.as_slice().expect("standard layout");
    let mut out = vec![H::default(); floats.len()];
    H::narrow(floats, &mut out);
    array(a.shape(), out)
}

impl Value {
    /// Its dtype.
    pub(crate) fn dtype(&self) -> DType {
        match self {
            Value::F64(_) => DType::F64,
            Value::F32(_) => DType::F32,
            Value::F16(_) => DType::F16,
            Value::BF16(_) => DType::BF16,
            Value::I64(_) => DType::I64,
            Value::I32(_) => DType::I32,
            Value::Bool(_) => DType::Bool,
        }
    }

    /// Its dimensions.
    pub(crate) fn shape(&self) -> &[usize] {
        with_value!(self, a => a.shape())
    }

    /// Its number of dimensions.
    pub(crate) fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// Bytes its elements take.
    pub(crate) fn bytes(&self) -> usize {
        with_value!(self, a => a.len()) * self.dtype().size_bytes()
    }

    /// The `f32` array, when it is one.
    pub(crate) fn as_f32(&self) -> Option<&Tensor> {
        match self {
            Value::F32(a) => Some(a),
            _ => None,
        }
    }

    /// `dims` filled with `value` converted to `dtype`.
    pub(crate) fn full(dtype: DType, dims: &[usize], value: f64) -> Value {
        by_dtype!(dtype, T => ArrayD::from_elem(IxDyn(dims), T::from_f64(value)))
    }

    /// A value from row-major elements (their dtype) whose count the type rule checked.
    pub(crate) fn from_elements(dims: &[usize], data: Elements) -> Value {
        match data {
            Elements::F64(v) => Value::F64(array(dims, v)),
            Elements::F32(v) => Value::F32(array(dims, v)),
            Elements::F16(v) => Value::F16(array(dims, v)),
            Elements::BF16(v) => Value::BF16(array(dims, v)),
            Elements::I64(v) => Value::I64(array(dims, v)),
            Elements::I32(v) => Value::I32(array(dims, v)),
            Elements::Bool(v) => Value::Bool(array(dims, v)),
        }
    }

    /// Its row-major elements.
    pub(crate) fn to_elements(&self) -> Elements {
        fn flat<T: Copy>(a: &ArrayD<T>) -> Vec<T> {
            a.as_slice().map_or_else(|| a.iter().copied().collect(), <[T]>::to_vec)
        }
        with_value!(self, a => Elements::from(flat(a)))
    }

    /// Its row-major elements, its buffer moved out without a copy when it holds exactly
    /// them (stored values do: results are kept row-major from the buffer's start).
    pub(crate) fn into_elements(self) -> Elements {
        fn flat<T: Copy>(a: ArrayD<T>) -> Vec<T> {
            if !a.is_standard_layout() {
                return a.iter().copied().collect();
            }
            let n = a.len();
            let (v, offset) = a.into_raw_vec_and_offset();
            let start = offset.unwrap_or(0);
            if start == 0 && v.len() == n {
                v
            } else {
                // Row-major from `start` (a slice that kept its parent's buffer).
                v[start..start + n].to_vec()
            }
        }
        with_value!(self, a => Elements::from(flat(a)))
    }

    /// The value converted to `dtype` (a copy when it already is).
    pub(crate) fn cast(&self, dtype: DType) -> Value {
        match (self, dtype) {
            _ if self.dtype() == dtype => self.clone(),
            (Value::F32(a), DType::F16) => Value::F16(narrowed(a)),
            (Value::F32(a), DType::BF16) => Value::BF16(narrowed(a)),
            (Value::F16(_) | Value::BF16(_), DType::F32) => Value::F32(self.f32().into_owned()),
            // A mask widened for arithmetic (`g * (x > 0)`, relu's gradient): one plain loop.
            (Value::Bool(a), DType::F32) => Value::F32(mask_f32(a)),
            _ => with_value!(self, a => by_dtype!(dtype, T => converted::<_, T>(a))),
        }
    }

    /// The value converted to `dtype`, moved (not copied) when it already is: for results
    /// computed in a wider type than they are kept in, most of them already kept in it.
    pub(crate) fn into_dtype(self, dtype: DType) -> Value {
        if self.dtype() == dtype {
            self
        } else {
            self.cast(dtype)
        }
    }

    /// The value as `dtype`, borrowed when it already is.
    pub(crate) fn to(&self, dtype: DType) -> std::borrow::Cow<'_, Value> {
        if self.dtype() == dtype {
            std::borrow::Cow::Borrowed(self)
        } else {
            std::borrow::Cow::Owned(self.cast(dtype))
        }
    }

    /// Its elements as a kernel buffer, for the dtypes kernels store.
    pub(crate) fn stored(&self) -> Option<Stored<'_>> {
        Some(match self {
            Value::F32(a) => Stored::F32(a.as_slice()?),
            Value::F16(a) => Stored::F16(a.as_slice()?),
            Value::BF16(a) => Stored::Bf16(a.as_slice()?),
            Value::Bool(a) => Stored::Bool(a.as_slice()?),
            _ => return None,
        })
    }

    /// Its elements as an `f64` or integer kernel's buffer.
    pub(crate) fn wide(&self) -> Option<Wide<'_>> {
        Some(match self {
            Value::F64(a) => Wide::F64(a.as_slice()?),
            Value::I64(a) => Wide::I64(a.as_slice()?),
            Value::I32(a) => Wide::I32(a.as_slice()?),
            Value::Bool(a) => Wide::Bool(a.as_slice()?),
            _ => return None,
        })
    }

    /// Its elements as a kernel's output buffer, for the dtypes kernels store.
    pub(crate) fn stored_mut(&mut self) -> Option<StoredMut<'_>> {
        Some(match self {
            Value::F32(a) => StoredMut::F32(a.as_slice_mut()?),
            Value::F16(a) => StoredMut::F16(a.as_slice_mut()?),
            Value::BF16(a) => StoredMut::Bf16(a.as_slice_mut()?),
            Value::Bool(a) => StoredMut::Bool(a.as_slice_mut()?),
            _ => return None,
        })
    }

    /// The value as `f32` (borrowed when it is one).
    pub(crate) fn f32(&self) -> std::borrow::Cow<'_, Tensor> {
        match self {
            Value::F32(a) => std::borrow::Cow::Borrowed(a),
            Value::F16(a) => std::borrow::Cow::Owned(widened(a)),
            Value::BF16(a) => std::borrow::Cow::Owned(widened(a)),
            Value::Bool(a) => std::borrow::Cow::Owned(mask_f32(a)),
            v => with_value!(v, a => std::borrow::Cow::Owned(converted(a))),
        }
    }

    pub(crate) fn f64(&self) -> ArrayD<f64> {
        with_value!(self, a => converted(a))
    }

    fn i64(&self) -> ArrayD<i64> {
        with_value!(self, a => converted(a))
    }

    /// A row-major copy with the new dimensions `dims` (same element count).
    pub(crate) fn reshaped(&self, dims: &[usize]) -> Value {
        map_value!(self, a => a.to_shape(dims).expect("the type rule kept the element count").as_standard_layout().into_owned())
    }

    /// Stretched to `dims` (the type rule checked they broadcast).
    pub(crate) fn broadcast_to(&self, dims: &[usize]) -> Value {
        map_value!(self, a => stretched(a, dims))
    }

    /// Result axis `i` is axis `perm[i]`.
    pub(crate) fn permuted(&self, perm: &[usize]) -> Value {
        map_value!(self, a => permute(a, perm))
    }

    /// Consecutive pieces along `axis` of the lengths given.
    pub(crate) fn split(&self, axis: usize, lens: &[usize]) -> Vec<Value> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let range = Slice::from(start..start + len);
                start += len;
                map_value!(self, a => a.slice_axis(Axis(axis), range).as_standard_layout().into_owned())
            })
            .collect()
    }

    /// A selection of elements: per axis `(lo, hi, step, reversed)`, then reshaped to `dims`.
    pub(crate) fn sliced(&self, axes: &[(usize, usize, usize, bool)], dims: &[usize]) -> Value {
        map_value!(self, a => {
            let mut view = a.view();
            for (axis, &(lo, hi, step, reversed)) in axes.iter().enumerate() {
                view.slice_axis_inplace(Axis(axis), Slice::new(lo as isize, Some(hi as isize), step as isize));
                if reversed {
                    view.invert_axis(Axis(axis));
                }
            }
            view.to_shape(dims).expect("the type rule kept the element count").as_standard_layout().into_owned()
        })
    }
}

/// `values` (one dtype, which the type rule checked) joined along `axis` into `dims`.
pub(crate) fn concat(values: &[&Value], axis: usize, dims: &[usize]) -> Value {
    fn join<T: Copy + Default>(arrays: Vec<ArrayViewD<'_, T>>, axis: usize, dims: &[usize]) -> ArrayD<T> {
        let mut out = ArrayD::from_elem(IxDyn(dims), T::default());
        let mut start = 0;
        for v in arrays {
            let len = v.shape()[axis];
            out.slice_axis_mut(Axis(axis), Slice::from(start..start + len)).assign(&v);
            start += len;
        }
        out
    }
    let dtype = values.first().map_or(DType::F32, |v| v.dtype());
    macro_rules! views {
        ($variant:ident) => {
            values
                .iter()
                .filter_map(|v| match v {
                    Value::$variant(a) => Some(a.view()),
                    _ => None,
                })
                .collect()
        };
    }
    match dtype {
        DType::F64 => Value::F64(join(views!(F64), axis, dims)),
        DType::F32 => Value::F32(join(views!(F32), axis, dims)),
        DType::F16 => Value::F16(join(views!(F16), axis, dims)),
        DType::BF16 => Value::BF16(join(views!(BF16), axis, dims)),
        DType::I64 => Value::I64(join(views!(I64), axis, dims)),
        DType::I32 => Value::I32(join(views!(I32), axis, dims)),
        DType::Bool => Value::Bool(join(views!(Bool), axis, dims)),
    }
}

/// An elementwise op of one operand computing in `dtype` (the result's).
pub(crate) fn unary(op: UnaryOp, a: &Value, dtype: DType) -> Value {
    let a = a.to(dtype);
    if let Some(v) = typed::unary(op, &a) {
        return v;
    }
    match &*a {
        Value::F32(a) => Value::F32(interp::unary(op, a)),
        Value::F64(a) => Value::F64(a.mapv(|x| op.apply_f64(x))),
        Value::F16(_) | Value::BF16(_) => halves_by_tiles(Node::Unary(op, 0), &[&a], a.shape(), dtype)
            .unwrap_or_else(|| Value::F32(interp::unary(op, &a.f32())).into_dtype(dtype)),
        Value::I64(_) | Value::I32(_) => {
            Value::I64(a.i64().mapv(|x| op.apply_int(x).unwrap_or_default())).into_dtype(dtype)
        }
        // The type rules give `bool` to no arithmetic op.
        Value::Bool(_) => a.into_owned(),
    }
}

/// `node`, a primitive op over inputs `0..operands.len()`, of operands of the half type
/// `dtype`, giving `dtype` over `dims`, tile by tile ([`eager_by_tiles`]); `None` where
/// that does not apply: another dtype, an operand broadcast other than from one element,
/// a composite op (its parts round as they go), no element.
fn halves_by_tiles(node: Node, operands: &[&Value], dims: &[usize], dtype: DType) -> Option<Value> {
    let n: usize = dims.iter().product();
    let prim = match node {
        Node::Unary(op, _) => matches!(op.def(), OpDef::Prim(_)),
        Node::Binary(op, _, _) => matches!(op.def(), OpDef::Prim(_)),
        _ => false,
    };
    if !matches!(dtype, DType::F16 | DType::BF16) || n == 0 || !prim {
        return None;
    }
    let mut inputs = Vec::with_capacity(operands.len());
    let mut access = Vec::with_capacity(operands.len());
    for v in operands {
        let stored = v.stored().filter(|_| v.dtype() == dtype)?;
        access.push(match () {
            _ if v.shape() == dims => Access::contiguous(dims),
            _ if stored.len() == 1 => Access { offset: 0, strides: vec![0; dims.len()] },
            _ => return None,
        });
        inputs.push(stored);
    }
    let mut nodes: Vec<Node> = (0..operands.len() as u32).map(Node::Input).collect();
    nodes.push(node);
    let kernel = MapKernel {
        shape: dims.to_vec(),
        inputs: access,
        nodes,
        output: Access::contiguous(dims),
        rows: vec![],
        reduce: None,
        compute: Compute::F32,
    };
    Some(match dtype {
        DType::F16 => {
            let mut out = vec![f16::ZERO; n];
            eager_by_tiles(&kernel, &inputs, StoredMut::F16(&mut out));
            Value::F16(array(dims, out))
        }
        _ => {
            let mut out = vec![bf16::ZERO; n];
            eager_by_tiles(&kernel, &inputs, StoredMut::Bf16(&mut out));
            Value::BF16(array(dims, out))
        }
    })
}

/// `a` (row-major) with result axis `i` its axis `perm[i]`, row-major. Swapping the last two
/// axes (a matrix's or a batch of matrices' transpose, what autograd's matmul gradients ask
/// for) is a cache-blocked transpose per matrix; `ndarray` copies other permutations
/// element by element in the result's order, with strided reads.
fn permute<T: Copy + Default>(a: &ArrayD<T>, perm: &[usize]) -> ArrayD<T> {
    let rank = perm.len();
    let swaps_last_two = rank >= 2
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2
        && perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p);
    match a.as_slice() {
        Some(data) if swaps_last_two && !data.is_empty() => {
            let (rows, cols) = (a.shape()[rank - 2], a.shape()[rank - 1]);
            let mut out = vec![T::default(); data.len()];
            for (from, to) in data.chunks_exact(rows * cols).zip(out.chunks_exact_mut(rows * cols)) {
                transpose::transpose(from, to, cols, rows);
            }
            let dims: Vec<usize> = perm.iter().map(|&p| a.shape()[p]).collect();
            ArrayD::from_shape_vec(dims, out).expect("a permutation keeps the element count")
        }
        _ => a.view().permuted_axes(perm).as_standard_layout().into_owned(),
    }
}

/// An elementwise op of two operands (cast to `compute`, broadcast to `dims`), giving
/// `result` (`bool` for comparisons).
pub(crate) fn binary(op: BinaryOp, a: &Value, b: &Value, dims: &[usize], compute: DType, result: DType) -> Value {
    let (a, b) = (a.to(compute), b.to(compute));
    if let (true, Value::F32(x), Value::F32(y)) = (result == DType::Bool, &*a, &*b) {
        if let Some(c) = interp::compare(op, &x.view(), &y.view(), dims) {
            return Value::Bool(c);
        }
    }
    if compute == result {
        if let Some(v) = halves_by_tiles(Node::Binary(op, 0, 1), &[&a, &b], dims, result) {
            return v;
        }
    }
    if let Some(v) = typed::binary(op, &a, &b, dims, result) {
        return v;
    }
    let zip = |x: ArrayViewD<'_, f64>, y: ArrayViewD<'_, f64>, f: &dyn Fn(f64, f64) -> f64| {
        Zip::from(x.broadcast(dims).expect("broadcast"))
            .and(y.broadcast(dims).expect("broadcast"))
            .map_collect(|&x, &y| f(x, y))
    };
    let out = match compute {
        DType::F32 | DType::F16 | DType::BF16 => Value::F32(interp::binary(op, &a.f32().view(), &b.f32().view(), dims)),
        DType::F64 => Value::F64(zip(a.f64().view(), b.f64().view(), &|x, y| op.apply_f64(x, y))),
        DType::I64 | DType::I32 | DType::Bool => {
            let (x, y) = (a.i64(), b.i64());
            let f = |x: i64, y: i64| op.apply_int(x, y).unwrap_or_default();
            Value::I64(
                Zip::from(x.broadcast(dims).expect("broadcast"))
                    .and(y.broadcast(dims).expect("broadcast"))
                    .map_collect(|&x, &y| f(x, y)),
            )
        }
    };
    // Comparisons computed 0 or 1; arithmetic narrows back (`i32` wraps, halves round).
    out.into_dtype(result)
}

/// `where`: `on_true` where `cond`, else `on_false`, as `dtype` broadcast to `dims`.
pub(crate) fn select(cond: &Value, on_true: &Value, on_false: &Value, dims: &[usize], dtype: DType) -> Value {
    let cond = match cond {
        Value::Bool(c) => std::borrow::Cow::Borrowed(c),
        other => match other.cast(DType::Bool) {
            Value::Bool(c) => std::borrow::Cow::Owned(c),
            _ => unreachable!("cast to bool gives bool"),
        },
    };
    let (t, f) = (on_true.to(dtype), on_false.to(dtype));
    typed::select(&cond, &t, &f, dims).unwrap_or_else(|| select_by_broadcast(&cond, &t, &f, dims, dtype))
}

/// [`select`] of any layout, `t` and `f` already `dtype`, by broadcasting each operand.
pub(crate) fn select_by_broadcast(cond: &ArrayD<bool>, t: &Value, f: &Value, dims: &[usize], dtype: DType) -> Value {
    let c = cond.broadcast(dims).expect("the type rule checked the shapes broadcast");
    macro_rules! pick {
        ($variant:ident) => {{
            let (Value::$variant(t), Value::$variant(f)) = (t, f) else { unreachable!("cast to one dtype") };
            let (t, f) = (t.broadcast(dims).expect("broadcast"), f.broadcast(dims).expect("broadcast"));
            Value::$variant(Zip::from(&c).and(&t).and(&f).map_collect(|&c, &t, &f| if c { t } else { f }))
        }};
    }
    match dtype {
        DType::F64 => pick!(F64),
        DType::F32 => pick!(F32),
        DType::F16 => pick!(F16),
        DType::BF16 => pick!(BF16),
        DType::I64 => pick!(I64),
        DType::I32 => pick!(I32),
        DType::Bool => pick!(Bool),
    }
}

/// A reduction of `a` over `axes` giving `dtype` (the type rule's), shaped `dims`.
pub(crate) fn reduce(op: ReduceOp, a: &Value, axes: &[usize], dims: &[usize], dtype: DType) -> Value {
    typed::reduce(op, a, axes, dims, dtype).unwrap_or_else(|| reduce_by_rows(op, a, axes, dims, dtype))
}

/// [`reduce`] by moving the reduced axes last, any layout and dtype.
pub(crate) fn reduce_by_rows(op: ReduceOp, a: &Value, axes: &[usize], dims: &[usize], dtype: DType) -> Value {
    match a {
        // Halves accumulate in f32 (the f32 reduction sums in f64) and round once.
        Value::F32(_) | Value::F16(_) | Value::BF16(_) => {
            Value::F32(interp::reduce(op, &a.f32(), axes, dims)).into_dtype(dtype)
        }
        Value::F64(a) => Value::F64(rows(a, axes, dims, |row| match op {
            ReduceOp::Sum => row.iter().sum(),
            ReduceOp::Mean => row.iter().sum::<f64>() / row.len() as f64,
            ReduceOp::Max => row.iter().fold(f64::NEG_INFINITY, |m, &x| BinaryOp::Maximum.apply_f64(m, x)),
            ReduceOp::Min => row.iter().fold(f64::INFINITY, |m, &x| BinaryOp::Minimum.apply_f64(m, x)),
        })),
        _ => {
            let a = a.i64();
            let out = rows(&a, axes, dims, |row| match op {
                ReduceOp::Max => row.iter().copied().max().unwrap_or(i64::MIN),
                ReduceOp::Min => row.iter().copied().min().unwrap_or(i64::MAX),
                // The type rules give integer means no operand.
                ReduceOp::Sum | ReduceOp::Mean => row.iter().fold(0i64, |s, &x| s.wrapping_add(x)),
            });
            Value::I64(out).into_dtype(dtype)
        }
    }
}

/// One result element per row of `a`'s `axes` (moved last), in row-major order.
fn rows<T: Copy + Default, R>(a: &ArrayD<T>, axes: &[usize], dims: &[usize], f: impl Fn(&[T]) -> R) -> ArrayD<R> {
    let kept: Vec<usize> = (0..a.ndim()).filter(|i| !axes.contains(i)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let inner: usize = axes.iter().map(|&i| a.shape()[i]).product();
    let moved = permute(a, &perm);
    let flat = moved.as_slice().unwrap_or(&[]);
    let values: Vec<R> = if inner == 0 {
        (0..dims.iter().product::<usize>()).map(|_| f(&[])).collect()
    } else {
        flat.chunks(inner).map(f).collect()
    };
    array(dims, values)
}

/// A matrix product computing in `dtype` (the result's): `f32` and halves through the
/// blocked `sgemm`, `f64` through `ndarray`'s `dgemm`, integers by rows, wrapping, checking
/// the cancel mark between rows.
pub(crate) fn matmul(a: &Value, b: &Value, dims: &[usize], dtype: DType) -> Result<Value, gt_ir::TypeError> {
    Ok(match dtype {
        DType::F32 | DType::F16 | DType::BF16 => {
            Value::F32(interp::matmul(a.f32().view(), b.f32().view(), dims)?).into_dtype(dtype)
        }
        DType::F64 => Value::F64(batched(a.f64().view(), b.f64().view(), dims, |x, y, c| {
            ndarray::linalg::general_mat_mul(1.0, &x, &y, 0.0, &mut zeroed(c))
        })?),
        _ => {
            let token = cancel::Token::current();
            Value::I64(batched(a.i64().view(), b.i64().view(), dims, |x, y, c| {
                // Zeroed first: a cancelled product leaves rows unwritten.
                let mut c = zeroed(c);
                // Rows of x against rows of y's transpose: both contiguous, so the inner loop
                // is a straight dot product.
                let (x, yt) = (x.as_standard_layout(), y.t().as_standard_layout().into_owned());
                for (i, mut row) in c.rows_mut().into_iter().enumerate() {
                    if token.stop() {
                        return;
                    }
                    let xi = x.row(i);
                    let xi = xi.as_slice().unwrap_or(&[]);
                    for (j, out) in row.iter_mut().enumerate() {
                        let yj = yt.row(j);
                        let yj = yj.as_slice().unwrap_or(&[]);
                        *out = xi.iter().zip(yj).fold(0i64, |s, (&p, &q)| s.wrapping_add(p.wrapping_mul(q)));
                    }
                }
            })?)
            .into_dtype(dtype)
        }
    })
}

/// `c` with every element set to zero, as a view of initialized values.
#[allow(unsafe_code)]
fn zeroed<T: Copy + Default>(
    mut c: ndarray::ArrayViewMut2<'_, std::mem::MaybeUninit<T>>,
) -> ndarray::ArrayViewMut2<'_, T> {
    c.fill(std::mem::MaybeUninit::new(T::default()));
    // SAFETY: every element was just written.
    unsafe { c.assume_init() }
}

/// NumPy `matmul` over batches (1-d operands promoted), `mm` on each 2-d pair (a sum over an
/// empty `k` is zeros, without `mm`). The result is allocated and not zeroed: `mm` must write
/// every element of its `c` (a product with `beta = 0` does, with no pass over memory before it;
/// zeroing a large result first costs as much as an elementwise op).
#[allow(unsafe_code)]
pub(crate) fn batched<T: Copy + Default + 'static>(
    a: ArrayViewD<'_, T>,
    b: ArrayViewD<'_, T>,
    dims: &[usize],
    mm: impl Fn(
        ndarray::ArrayView2<'_, T>,
        ndarray::ArrayView2<'_, T>,
        ndarray::ArrayViewMut2<'_, std::mem::MaybeUninit<T>>,
    ),
) -> Result<ArrayD<T>, gt_ir::TypeError> {
    use gt_ir::verify::shape;
    use gt_ir::Shape;
    let a = if a.ndim() == 1 { a.insert_axis(Axis(0)) } else { a };
    let b = if b.ndim() == 1 { b.insert_axis(Axis(1)) } else { b };
    let (ra, rb) = (a.ndim(), b.ndim());
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let batch = shape::broadcast_shapes(&Shape::from(&a.shape()[..ra - 2]), &Shape::from(&b.shape()[..rb - 2]))?;
    let with = |rows: usize, cols: usize| batch.dims().iter().copied().chain([rows, cols]).collect::<Vec<_>>();
    let (a, b) = (a.broadcast(with(m, k)).expect("broadcast"), b.broadcast(with(k, n)).expect("broadcast"));
    let mut out = ArrayD::<T>::uninit(IxDyn(&with(m, n)));
    if k == 0 {
        // A sum of nothing.
        out.fill(std::mem::MaybeUninit::new(T::default()));
    } else if m > 0 && n > 0 {
        for index in ndarray::indices(batch.dims()) {
            let index = index.slice();
            let (mut x, mut y, mut c) = (a.view(), b.view(), out.view_mut());
            for &i in index {
                x = x.index_axis_move(Axis(0), i);
                y = y.index_axis_move(Axis(0), i);
                c = c.index_axis_move(Axis(0), i);
            }
            let c = c.into_dimensionality::<ndarray::Ix2>().expect("a matrix");
            let x = x.into_dimensionality::<ndarray::Ix2>().expect("a matrix");
            let y = y.into_dimensionality::<ndarray::Ix2>().expect("a matrix");
            mm(x, y, c);
        }
    }
    // SAFETY: every element was written: zeros for k = 0, else by `mm` (its contract), batch
    // index by batch index over the whole broadcast batch.
    let out = unsafe { out.assume_init() };
    // Row-major already: reshaping it moves the data, no copy.
    Ok(out.into_shape_with_order(IxDyn(dims)).expect("the type rule kept the element count"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read's elements follow the value's row-major order, for a strided view too, not
    /// its memory's.
    #[test]
    fn read_elements_are_row_major() {
        let f = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.5f32, -2.0, 3.25, 0.0, -0.0, 7.0]).unwrap();
        assert_eq!(Value::F32(f.clone()).to_elements(), Elements::F32(vec![1.5, -2.0, 3.25, 0.0, -0.0, 7.0]));
        let strided = Value::F32(f.reversed_axes());
        assert_eq!(strided.to_elements(), Elements::F32(vec![1.5, 0.0, -2.0, -0.0, 3.25, 7.0]));
    }

    /// The blocked transpose of the last two axes gives what `ndarray`'s element-by-element
    /// copy gives, batched or not, for odd sizes and other dtypes; other permutations and
    /// empty arrays take the copy.
    #[test]
    fn permute_matches_the_strided_copy() {
        fn check<T: Copy + Default + PartialEq + std::fmt::Debug>(
            dims: &[usize],
            perm: &[usize],
            f: impl Fn(usize) -> T,
        ) {
            let n = dims.iter().product();
            let a = ArrayD::from_shape_vec(dims, (0..n).map(f).collect()).unwrap();
            let expected = a.view().permuted_axes(perm).as_standard_layout().into_owned();
            let got = permute(&a, perm);
            assert_eq!(got.shape(), expected.shape(), "{dims:?} {perm:?}");
            assert_eq!(got.as_slice().unwrap(), expected.as_slice().unwrap(), "{dims:?} {perm:?}");
        }
        check(&[37, 53], &[1, 0], |i| i as f32);
        check(&[3, 17, 5], &[0, 2, 1], |i| i as i64);
        check(&[2, 3, 4, 5], &[0, 1, 3, 2], |i| bf16::from_f32(i as f32));
        check(&[2, 3, 4], &[2, 1, 0], |i| i % 3 == 0);
        check(&[0, 4], &[1, 0], |i| i as f32);
        check(&[1, 1], &[1, 0], |i| i as i32);
    }

    /// Elementwise ops on halves by tiles give the bits of widening whole operands,
    /// computing in `f32` and rounding the whole result: every primitive unary and binary
    /// op, `f16` and `bf16`, across tile boundaries, with a one-element operand, on special
    /// values too, and with a 0-d operand.
    #[test]
    fn halves_by_tiles_give_the_bits_of_the_whole_tensor_path() {
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, 6e4, -7e4, 1.0, -1.0];
        let data = |n: usize, seed: u64| -> Vec<f32> {
            (0..n)
                .map(|i| match i % 11 {
                    10 => specials[(i / 11 + seed as usize) % specials.len()],
                    _ => gt_ir::random::uniform(seed, i as u64) * 16.0 - 8.0,
                })
                .collect()
        };
        let bits = |v: &Value| -> Vec<u64> {
            match v.to_elements() {
                Elements::F16(e) => {
                    e.iter().map(|x| if x.is_nan() { u64::MAX } else { u64::from(x.to_bits()) }).collect()
                }
                Elements::BF16(e) => {
                    e.iter().map(|x| if x.is_nan() { u64::MAX } else { u64::from(x.to_bits()) }).collect()
                }
                other => panic!("not halves: {other:?}"),
            }
        };
        for dtype in [DType::F16, DType::BF16] {
            let half = |dims: &[usize], seed| Value::F32(array(dims, data(dims.iter().product(), seed))).cast(dtype);
            for n in [1usize, 7, 513, 2000] {
                let dims = [n];
                let (a, b, one, scalar) = (half(&dims, 1), half(&dims, 2), half(&[1], 3), half(&[], 4));
                let mut tiled = 0;
                for &op in UnaryOp::ALL {
                    let want = Value::F32(interp::unary(op, &a.f32())).into_dtype(dtype);
                    tiled += usize::from(halves_by_tiles(Node::Unary(op, 0), &[&a], &dims, dtype).is_some());
                    assert_eq!(bits(&unary(op, &a, dtype)), bits(&want), "{op:?} {dtype:?} n={n}");
                }
                for &op in BinaryOp::ALL {
                    for (x, y) in [(&a, &b), (&a, &one), (&one, &b), (&scalar, &a)] {
                        if op.is_comparison() {
                            continue;
                        }
                        let result = dtype;
                        tiled += usize::from(halves_by_tiles(Node::Binary(op, 0, 1), &[x, y], &dims, dtype).is_some());
                        let want =
                            Value::F32(interp::binary(op, &x.f32().view(), &y.f32().view(), &dims)).into_dtype(result);
                        assert_eq!(
                            bits(&binary(op, x, y, &dims, dtype, result)),
                            bits(&want),
                            "{op:?} {dtype:?} n={n}"
                        );
                    }
                }
                assert!(tiled > 20, "the primitive unary and binary ops run by tiles ({tiled})");
            }
        }
    }
}
