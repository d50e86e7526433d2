//! Eager elementwise ops on `f64` and integer tensors, as `f32` ones run: one loop per
//! primitive (its scalar function a closure of its own type, from the op table's
//! `specialize_as`), split over the worker's threads, over operands stored whole, as one
//! element, as a period repeated over leading axes (a bias, a mask) or with each element
//! spread over trailing axes (a per-row value), cut into stretches that cross no period's
//! end; `where` of every dtype the same way. Other layouts and composite ops take
//! `value.rs`'s general way; both give the op table's semantics, so the same bits.

use super::value::{array, Value};
use super::{threads, vmath};
use gt_ir::ops::{BinaryKernelAs, BinaryPrim, OpDef, Scalar, UnaryKernelAs, UnaryPrim};
use gt_ir::{BinaryOp, DType, ReduceOp, UnaryOp};
use ndarray::ArrayD;
use std::mem::MaybeUninit;

/// A binary primitive over two operands laid out as [`Tiled`] says, into `T` or, for a
/// comparison, into `bool`.
struct Zipped<'a, T> {
    x: Tiled<'a, T>,
    y: Tiled<'a, T>,
    dims: &'a [usize],
    truth: bool,
}

enum Out<T> {
    Same(ArrayD<T>),
    Truth(ArrayD<bool>),
}

impl<T: Scalar> BinaryKernelAs<T, Out<T>> for Zipped<'_, T> {
    fn call<F: Fn(T, T) -> T + Copy + Send + Sync>(self, f: F) -> Out<T> {
        let Zipped { x, y, dims, truth } = self;
        let n = dims.iter().product();
        // `f` over every element, split over the threads by stretches.
        fn all<T: Copy + Sync, U: Copy + Send>(
            n: usize,
            x: Tiled<T>,
            y: Tiled<T>,
            f: impl Fn(T, T) -> U + Sync,
        ) -> Vec<U> {
            let room = |g| x.room(g).min(y.room(g));
            stretched(n, room, |g, out| zip_into(x.stretch(g, out.len()), y.stretch(g, out.len()), out, &f))
        }
        if truth {
            Out::Truth(array(dims, all(n, x, y, |x, y| f(x, y) != T::ZERO)))
        } else {
            Out::Same(array(dims, all(n, x, y, f)))
        }
    }
}

struct Mapped<'a, T> {
    x: &'a [T],
    dims: &'a [usize],
}

impl<T: Scalar> UnaryKernelAs<T, ArrayD<T>> for Mapped<'_, T> {
    fn call<F: Fn(T) -> T + Copy + Send + Sync>(self, f: F) -> ArrayD<T> {
        let x = self.x;
        let n = x.len();
        array(
            self.dims,
            threads::written_as(n, |at, out| {
                let n = out.len();
                for (o, &x) in out.iter_mut().zip(&x[at..at + n]) {
                    o.write(f(x));
                }
            }),
        )
    }
}

/// `op` on `a` and `b` (both already in the dtype it computes in) broadcast to `dims`,
/// giving `result` (that dtype, or `bool` for a comparison); `None` where this way does not
/// apply (another dtype, a composite op, a float-only op on integers, an operand laid out
/// otherwise than [`Tiled`] takes).
pub(crate) fn binary(op: BinaryOp, a: &Value, b: &Value, dims: &[usize], result: DType) -> Option<Value> {
    let OpDef::Prim(p) = op.def() else { return None };
    let n: usize = dims.iter().product();
    let truth = result == DType::Bool && op.row().compare;
    if !truth && result != a.dtype() {
        return None;
    }
    let integer_op = p.apply_int(0, 1).is_some();
    fn run<T: Scalar>(
        p: BinaryPrim,
        x: &ArrayD<T>,
        y: &ArrayD<T>,
        n: usize,
        dims: &[usize],
        truth: bool,
    ) -> Option<Out<T>> {
        if n == 0 {
            return None;
        }
        let (x, y) = (Tiled::of(x, dims)?, Tiled::of(y, dims)?);
        Some(p.specialize_as(Zipped { x, y, dims, truth }))
    }
    let out = match (a, b) {
        (Value::F64(x), Value::F64(y)) => match run(p, x, y, n, dims, truth)? {
            Out::Same(v) => Value::F64(v),
            Out::Truth(v) => Value::Bool(v),
        },
        (Value::I64(x), Value::I64(y)) if integer_op => match run(p, x, y, n, dims, truth)? {
            Out::Same(v) => Value::I64(v),
            Out::Truth(v) => Value::Bool(v),
        },
        (Value::I32(x), Value::I32(y)) if integer_op => match run(p, x, y, n, dims, truth)? {
            Out::Same(v) => Value::I32(v),
            Out::Truth(v) => Value::Bool(v),
        },
        _ => return None,
    };
    Some(out)
}

/// `op` on `a` (already `dtype`, the result's), as [`binary`]; `None` where it does not apply.
pub(crate) fn unary(op: UnaryOp, a: &Value) -> Option<Value> {
    let OpDef::Prim(p) = op.def() else { return None };
    let integer_op = p.apply_int(1).is_some();
    fn run<T: Scalar>(p: UnaryPrim, x: &ArrayD<T>) -> Option<ArrayD<T>> {
        Some(p.specialize_as(Mapped { x: x.as_slice()?, dims: x.shape() }))
    }
    Some(match a {
        // The transcendental functions in loops of the host's widest vectors.
        Value::F64(x) if vmath::is_costly_f64(p) => {
            let xs = x.as_slice()?;
            let out = threads::written_as(xs.len(), |at, out| {
                vmath::map_f64(p, &xs[at..at + out.len()], out);
            });
            Value::F64(array(x.shape(), out))
        }
        Value::F64(x) => Value::F64(run(p, x)?),
        Value::I64(x) if integer_op => Value::I64(run(p, x)?),
        Value::I32(x) if integer_op => Value::I32(run(p, x)?),
        _ => return None,
    })
}

/// Rows of `inner` elements of `data`, each reduced by `f`, split over the threads by rows;
/// a single long row by stretches combined in order by `combine` (for folds that any split
/// leaves exact: `max`, `min`, wrapping integer sums).
fn by_rows<T: Copy + Sync, R: Copy + Send>(
    data: &[T],
    inner: usize,
    rows: usize,
    f: impl Fn(&[T]) -> R + Sync,
    combine: Option<fn(R, R) -> R>,
) -> Vec<R> {
    if inner == 0 {
        return (0..rows).map(|_| f(&[])).collect();
    }
    if let (1, Some(combine)) = (rows, combine) {
        let parts = threads::loop_parts(data.len() / threads::TEAM_MIN_ELEMENTS, data.len());
        if parts > 1 {
            let step = data.len().div_ceil(parts);
            let partials: Vec<std::sync::Mutex<Option<R>>> = (0..parts).map(|_| std::sync::Mutex::new(None)).collect();
            threads::run_parts(parts, |i| {
                let stretch = &data[(i * step).min(data.len())..((i + 1) * step).min(data.len())];
                *partials[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(f(stretch));
            });
            let all = partials.into_iter().filter_map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()));
            return all.reduce(combine).into_iter().collect();
        }
    }
    threads::written_as(rows, |at, out| {
        for (k, o) in out.iter_mut().enumerate() {
            o.write(f(&data[(at + k) * inner..][..inner]));
        }
    })
}

/// The fold of `row` by `maximum` (`better`: `x > m`) or `minimum` (`x < m`) from `start`
/// (the infinity on the other side), as the op table's fold in order gives it: the first NaN
/// met, else the first element equal to the extreme (a zero's sign is the first zero's). It
/// is found in eight independent lanes, so the loop vectorizes, and looked up again in order
/// only where a NaN or a zero decides.
fn extreme(row: &[f64], start: f64, better: impl Fn(f64, f64) -> bool) -> f64 {
    let mut lanes = [start; 8];
    let mut nan = false;
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (lane, &x) in lanes.iter_mut().zip(c) {
            nan |= x.is_nan();
            *lane = if better(x, *lane) { x } else { *lane };
        }
    }
    for &x in tail {
        nan |= x.is_nan();
        lanes[0] = if better(x, lanes[0]) { x } else { lanes[0] };
    }
    if nan {
        return row.iter().copied().find(|x| x.is_nan()).unwrap_or(f64::NAN);
    }
    let m = lanes.into_iter().fold(start, |m, x| if better(x, m) { x } else { m });
    if m == 0.0 {
        return row.iter().copied().find(|&x| x == 0.0).unwrap_or(m);
    }
    m
}

/// A reduction over trailing axes `axes` of `a` (stored row-major), giving `dtype` shaped
/// `dims`: `f64` folds as `value.rs`'s (a sum in order along each row, so the same bits),
/// integers without widening to `i64` first (max and min in their own type, sums wrapping in
/// `i64`, the dtype the type rules give them); `None` where this way does not apply.
pub(crate) fn reduce(op: ReduceOp, a: &Value, axes: &[usize], dims: &[usize], dtype: DType) -> Option<Value> {
    let rank = a.shape().len();
    let trailing = axes.iter().enumerate().all(|(i, &x)| x == rank - axes.len() + i);
    if !trailing {
        return None;
    }
    let inner: usize = a.shape()[rank - axes.len()..].iter().product();
    let rows: usize = a.shape()[..rank - axes.len()].iter().product();
    // `lo` and `hi`: the type's least and greatest value (an empty row's max and min).
    fn ints<T: Copy + Ord + Sync + Send + Into<i64>>(
        op: ReduceOp,
        data: &[T],
        inner: usize,
        rows: usize,
        (lo, hi): (T, T),
    ) -> Option<Vec<i64>> {
        Some(match op {
            ReduceOp::Max => {
                by_rows(data, inner, rows, |r| r.iter().copied().max().unwrap_or(lo).into(), Some(i64::max))
            }
            ReduceOp::Min => {
                by_rows(data, inner, rows, |r| r.iter().copied().min().unwrap_or(hi).into(), Some(i64::min))
            }
            ReduceOp::Sum => by_rows(
                data,
                inner,
                rows,
                |r| r.iter().fold(0i64, |s, &x| s.wrapping_add(x.into())),
                Some(i64::wrapping_add),
            ),
            // The type rules give integer means no operand.
            ReduceOp::Mean => return None,
        })
    }
    let out = match a {
        Value::F64(x) => {
            let data = x.as_slice()?;
            let max = |r: &[f64]| extreme(r, f64::NEG_INFINITY, |x, m| x > m);
            let min = |r: &[f64]| extreme(r, f64::INFINITY, |x, m| x < m);
            let max_of = |a: f64, b: f64| BinaryPrim::Maximum.apply_f64(a, b);
            let min_of = |a: f64, b: f64| BinaryPrim::Minimum.apply_f64(a, b);
            let v = match op {
                ReduceOp::Sum => by_rows(data, inner, rows, |r| r.iter().sum::<f64>(), None),
                ReduceOp::Mean => by_rows(data, inner, rows, |r| r.iter().sum::<f64>() / r.len() as f64, None),
                ReduceOp::Max => by_rows(data, inner, rows, max, Some(max_of)),
                ReduceOp::Min => by_rows(data, inner, rows, min, Some(min_of)),
            };
            Value::F64(array(dims, v))
        }
        Value::I64(x) => Value::I64(array(dims, ints(op, x.as_slice()?, inner, rows, (i64::MIN, i64::MAX))?)),
        Value::I32(x) => Value::I64(array(dims, ints(op, x.as_slice()?, inner, rows, (i32::MIN, i32::MAX))?)),
        _ => return None,
    };
    Some(out.into_dtype(dtype))
}

/// An operand over the result's elements: all of them in order, one for every element, a
/// period repeated over leading axes (a bias `[n]` over `[m, n]`, a mask `[T, T]` over
/// `[B, T, T]`), or each element spread over trailing axes (a per-row `[m, 1]` over
/// `[m, n]`: element `k` of the result takes element `k / inner`).
#[derive(Clone, Copy)]
enum Tiled<'a, T> {
    Whole(&'a [T]),
    One(T),
    Period(&'a [T]),
    Spread { data: &'a [T], inner: usize },
}

impl<'a, T: Copy> Tiled<'a, T> {
    /// `a` broadcast to `dims` (the type rule checked it broadcasts), where it is stored
    /// row-major as one of these.
    fn of(a: &'a ArrayD<T>, dims: &[usize]) -> Option<Self> {
        let data = a.as_slice()?;
        if data.len() == 1 {
            return Some(Tiled::One(data[0]));
        }
        if a.ndim() > dims.len() || data.is_empty() {
            return None;
        }
        // The operand's shape aligned to the result's trailing axes, ones in front; a
        // period is those ones, then the result's own extents.
        let shape: Vec<usize> =
            std::iter::repeat_n(1, dims.len() - a.ndim()).chain(a.shape().iter().copied()).collect();
        let ones = shape.iter().take_while(|&&d| d == 1).count();
        if shape[ones..] == dims[ones..] {
            return Some(if dims[..ones].iter().all(|&d| d == 1) { Tiled::Whole(data) } else { Tiled::Period(data) });
        }
        let kept = shape.len() - shape.iter().rev().take_while(|&&d| d == 1).count();
        (shape[..kept] == dims[..kept]).then(|| Tiled::Spread { data, inner: dims[kept..].iter().product() })
    }

    /// Elements `at..at + len` of the result's, which cross no period's end.
    fn stretch(self, at: usize, len: usize) -> Src<'a, T> {
        match self {
            Tiled::Whole(v) => Src::Slice(&v[at..at + len]),
            Tiled::One(x) => Src::Const(x),
            Tiled::Period(v) => {
                let o = at % v.len();
                Src::Slice(&v[o..o + len])
            }
            Tiled::Spread { data, inner } => Src::Const(data[at / inner]),
        }
    }

    /// Elements from `at` up to the end of the period (or spread element) holding it
    /// (`usize::MAX`: none).
    fn room(self, at: usize) -> usize {
        match self {
            Tiled::Period(v) => v.len() - at % v.len(),
            Tiled::Spread { inner, .. } => inner - at % inner,
            _ => usize::MAX,
        }
    }
}

/// `n` elements written by `fill(g, out)` (elements `g..g + out.len()`) over the threads,
/// in stretches that cross none of the operands' period ends (`room(g)`: elements from `g`
/// to the next).
fn stretched<U: Send>(
    n: usize,
    room: impl Fn(usize) -> usize + Sync,
    fill: impl Fn(usize, &mut [MaybeUninit<U>]) + Sync,
) -> Vec<U> {
    threads::written_as(n, |at, out| {
        let mut done = 0;
        while done < out.len() {
            let g = at + done;
            let len = (out.len() - done).min(room(g));
            fill(g, &mut out[done..done + len]);
            done += len;
        }
    })
}

/// `out[k] = f(x[k], y[k])` over a stretch, one plain loop per case so that it vectorizes.
fn zip_into<T: Copy, U: Copy>(x: Src<T>, y: Src<T>, out: &mut [MaybeUninit<U>], f: impl Fn(T, T) -> U) {
    let n = out.len();
    match (x, y) {
        (Src::Slice(x), Src::Slice(y)) => {
            for ((o, &x), &y) in out.iter_mut().zip(&x[..n]).zip(&y[..n]) {
                o.write(f(x, y));
            }
        }
        (Src::Slice(x), Src::Const(y)) => {
            for (o, &x) in out.iter_mut().zip(&x[..n]) {
                o.write(f(x, y));
            }
        }
        (Src::Const(x), Src::Slice(y)) => {
            for (o, &y) in out.iter_mut().zip(&y[..n]) {
                o.write(f(x, y));
            }
        }
        (Src::Const(x), Src::Const(y)) => {
            let v = f(x, y);
            out.iter_mut().for_each(|o| {
                o.write(v);
            });
        }
    }
}

/// A stretch of an operand: its elements, or one value for all.
#[derive(Clone, Copy)]
enum Src<'a, T> {
    Slice(&'a [T]),
    Const(T),
}

/// `out[k] = if c[k] { t[k] } else { f[k] }`, one plain loop per case so that it vectorizes.
fn pick_into<T: Copy>(c: Src<bool>, t: Src<T>, f: Src<T>, out: &mut [MaybeUninit<T>]) {
    let n = out.len();
    match (c, t, f) {
        (Src::Const(c), t, f) => match if c { t } else { f } {
            Src::Slice(v) => out.iter_mut().zip(&v[..n]).for_each(|(o, &x)| {
                o.write(x);
            }),
            Src::Const(x) => out.iter_mut().for_each(|o| {
                o.write(x);
            }),
        },
        (Src::Slice(c), Src::Slice(t), Src::Slice(f)) => {
            for (((o, &c), &t), &f) in out.iter_mut().zip(&c[..n]).zip(&t[..n]).zip(&f[..n]) {
                o.write(if c { t } else { f });
            }
        }
        (Src::Slice(c), Src::Slice(t), Src::Const(f)) => {
            for ((o, &c), &t) in out.iter_mut().zip(&c[..n]).zip(&t[..n]) {
                o.write(if c { t } else { f });
            }
        }
        (Src::Slice(c), Src::Const(t), Src::Slice(f)) => {
            for ((o, &c), &f) in out.iter_mut().zip(&c[..n]).zip(&f[..n]) {
                o.write(if c { t } else { f });
            }
        }
        (Src::Slice(c), Src::Const(t), Src::Const(f)) => {
            for (o, &c) in out.iter_mut().zip(&c[..n]) {
                o.write(if c { t } else { f });
            }
        }
    }
}

/// `where cond, t, f` broadcast to `dims`, `t` and `f` already in the result's dtype: split
/// over the threads, each stretch cut at the operands' period ends ([`stretched`]); `None` where an operand
/// is stored otherwise (the general way runs it).
pub(crate) fn select(cond: &ArrayD<bool>, t: &Value, f: &Value, dims: &[usize]) -> Option<Value> {
    fn run<T: Copy + Send + Sync>(c: &ArrayD<bool>, t: &ArrayD<T>, f: &ArrayD<T>, dims: &[usize]) -> Option<ArrayD<T>> {
        let n: usize = dims.iter().product();
        let (c, t, f) = (Tiled::of(c, dims)?, Tiled::of(t, dims)?, Tiled::of(f, dims)?);
        let room = |g| c.room(g).min(t.room(g)).min(f.room(g));
        let each = |g, out: &mut [_]| {
            let len = out.len();
            pick_into(c.stretch(g, len), t.stretch(g, len), f.stretch(g, len), out);
        };
        Some(array(dims, stretched(n, room, each)))
    }
    if dims.contains(&0) {
        return None;
    }
    Some(match (t, f) {
        (Value::F32(t), Value::F32(f)) => Value::F32(run(cond, t, f, dims)?),
        (Value::F64(t), Value::F64(f)) => Value::F64(run(cond, t, f, dims)?),
        (Value::F16(t), Value::F16(f)) => Value::F16(run(cond, t, f, dims)?),
        (Value::BF16(t), Value::BF16(f)) => Value::BF16(run(cond, t, f, dims)?),
        (Value::I64(t), Value::I64(f)) => Value::I64(run(cond, t, f, dims)?),
        (Value::I32(t), Value::I32(f)) => Value::I32(run(cond, t, f, dims)?),
        (Value::Bool(t), Value::Bool(f)) => Value::Bool(run(cond, t, f, dims)?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::ops::UnaryPrim;

    fn f64s(dims: &[usize], v: Vec<f64>) -> Value {
        Value::F64(array(dims, v))
    }

    /// Every primitive, whole and one-element operands, against the op table's scalar
    /// functions element by element.
    #[test]
    fn typed_loops_compute_what_the_op_table_says() {
        // Past one thread's stretch, so the loop splits over a team of two.
        threads::use_threads(2, std::time::Duration::from_micros(200)).unwrap();
        let n = 70_000;
        let xs: Vec<f64> = (0..n).map(|i| (i as f64 - 35_000.0) / 997.0).collect();
        let ys: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 / 100.0 - 5.0).collect();
        let (x, y) = (f64s(&[n], xs.clone()), f64s(&[n], ys.clone()));
        let one = f64s(&[], vec![1.5]);
        for &p in BinaryPrim::ALL {
            let op = p.op();
            let result = if op.row().compare { DType::Bool } else { DType::F64 };
            for (b, yv) in [(&y, None), (&one, Some(1.5))] {
                let got = binary(op, &x, b, &[n], result).expect("a flat f64 operand");
                for i in (0..n).step_by(97) {
                    let want = p.apply_f64(xs[i], yv.unwrap_or(ys[i]));
                    let g = match &got {
                        Value::F64(v) => v.as_slice().unwrap()[i],
                        Value::Bool(v) => f64::from(u8::from(v.as_slice().unwrap()[i])),
                        _ => unreachable!(),
                    };
                    assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{p:?} at {i}");
                }
            }
        }
        let is: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(104_729).wrapping_sub(7)).collect();
        let js: Vec<i32> = (0..n as i32).map(|i| i.wrapping_mul(-31_337)).collect();
        let (i, j) = (Value::I32(array(&[n], is.clone())), Value::I32(array(&[n], js.clone())));
        for &p in BinaryPrim::ALL {
            let op = p.op();
            let result = if op.row().compare { DType::Bool } else { DType::I32 };
            let got = binary(op, &i, &j, &[n], result);
            let Some(want_at) = (0..n).map(|k| p.apply_int(is[k].into(), js[k].into())).collect::<Option<Vec<i64>>>()
            else {
                assert!(got.is_none(), "{p:?} is float-only");
                continue;
            };
            let got: Vec<i64> = match got.unwrap() {
                Value::I32(v) => v.iter().map(|&v| i64::from(v)).collect(),
                Value::Bool(v) => v.iter().map(|&v| i64::from(v)).collect(),
                _ => unreachable!(),
            };
            let want: Vec<i64> =
                want_at.into_iter().map(|w| if op.row().compare { w } else { i64::from(w as i32) }).collect();
            assert_eq!(got, want, "{p:?}");
        }
        for &p in UnaryPrim::ALL {
            let got = unary(p.op(), &x).expect("f64");
            let Value::F64(v) = got else { unreachable!() };
            for k in (0..n).step_by(101) {
                let (g, w) = (v.as_slice().unwrap()[k], p.apply_f64(xs[k]));
                assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{p:?}");
            }
            let got = unary(p.op(), &i);
            match p.apply_int(3) {
                None => assert!(got.is_none()),
                Some(_) => {
                    let Some(Value::I32(v)) = got else { panic!("{p:?} on i32") };
                    let want: Vec<i32> = is.iter().map(|&x| p.apply_int(x.into()).unwrap() as i32).collect();
                    assert_eq!(v.as_slice().unwrap(), &want[..], "{p:?}");
                }
            }
        }
        // Reductions: the same values as the general way (moving the reduced axes last).
        let m = f64s(&[3, 5, 4_000], (0..60_000).map(|k| ((k * 7919) % 20_011) as f64 - 10_000.0).collect());
        let mut nan = m.clone();
        if let Value::F64(a) = &mut nan {
            a.as_slice_mut().unwrap()[31_234] = f64::NAN;
        }
        // Rows whose extreme is a zero of either sign first, and NaNs with different
        // payloads: the first met decides. `sign` makes every other element negative (a max of
        // zero) or positive (a min of zero).
        // (Rows of 18: the first zero is in lane 6, a zero of the other sign after it in
        // lane 1, so combining the lanes in lane order would take the wrong one.)
        let zeros = |sign: f64| {
            let first = |k: usize| if (k / 18).is_multiple_of(2) { 0.0 } else { -0.0 };
            f64s(
                &[2, 2, 18],
                (0..72)
                    .map(|k| match k % 18 {
                        6 => first(k),
                        9 => -first(k),
                        _ if k == 43 => f64::from_bits(0x7ff8_0000_0000_0001),
                        _ if k == 52 => f64::from_bits(0xfff8_0000_0000_0002),
                        _ => sign * (k as f64 + 1.0),
                    })
                    .collect(),
            )
        };
        let (below, above) = (zeros(-1.0), zeros(1.0));
        let ints =
            Value::I32(array(&[3, 5, 4_000], (0..60_000i64).map(|k| (k * 104_729 % 65_521) as i32 - 30_000).collect()));
        for a in [&m, &nan, &below, &above, &ints] {
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
                for axes in [&[0, 1, 2][..], &[1, 2], &[2], &[]] {
                    let dtype = gt_ir::verify::shape::reduce_dtype(op, "reduce", a.dtype());
                    let Ok(dtype) = dtype else { continue };
                    let dims: Vec<usize> = (0..3).filter(|i| !axes.contains(i)).map(|i| a.shape()[i]).collect();
                    let got = reduce(op, a, axes, &dims, dtype).expect("trailing axes");
                    let want = super::super::value::reduce_by_rows(op, a, axes, &dims, dtype);
                    let bits = |v: &Value| {
                        (v.dtype(), v.shape().to_vec(), v.f64().iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    };
                    assert_eq!(bits(&got), bits(&want), "{op:?} over {axes:?}");
                }
            }
        }
        assert!(reduce(ReduceOp::Sum, &m, &[0], &[5, 4_000], DType::F64).is_none());
    }

    /// Binary ops over every layout this way takes (a bias, a per-row value, a mask-like
    /// period, whole and one-element operands, either side) and some it leaves to the general
    /// way, in `f64`, `i64` and `i32`, split over the team: each element is the op table's
    /// function of the operands' elements that broadcast to it.
    #[test]
    fn binary_ops_of_every_layout_give_the_broadcast_elements() {
        use ndarray::{IxDyn, Zip};
        // Past one thread's stretch (`TEAM_MIN_ELEMENTS`), so the loop splits over a team of
        // two, at an element that ends no period.
        threads::use_threads(2, std::time::Duration::from_micros(200)).unwrap();
        let dims = [17usize, 51, 101];
        let shapes: [&[usize]; 9] =
            [&[], &[1], &[101], &[51, 101], &[1, 51, 101], &[17, 51, 101], &[17, 1, 101], &[17, 51, 1], &[17, 1, 1]];
        let numbers = |shape: &[usize], seed: usize| -> ArrayD<i64> {
            let n: usize = shape.iter().product();
            let v = (0..n).map(|i| ((i * 7919 + seed * 104_729) % 1013) as i64 - 500).collect();
            ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
        };
        let ops = [BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Maximum, BinaryOp::Lt, BinaryOp::Div];
        let mut fast = 0;
        for (i, a) in shapes.iter().enumerate() {
            for (j, b) in shapes.iter().enumerate() {
                let (x, y) = (numbers(a, i), numbers(b, j + 1));
                let (xb, yb) = (x.broadcast(&dims[..]).unwrap(), y.broadcast(&dims[..]).unwrap());
                for op in ops {
                    let p = match op.def() {
                        OpDef::Prim(p) => p,
                        OpDef::Composite(_) => unreachable!(),
                    };
                    let truth = op.row().compare;
                    // f64 (x / 7 so that divisions round), then the integers.
                    let fx = Value::F64(x.mapv(|v| v as f64 / 7.0));
                    let fy = Value::F64(y.mapv(|v| v as f64));
                    let result = if truth { DType::Bool } else { DType::F64 };
                    let want: Vec<f64> = Zip::from(&xb)
                        .and(&yb)
                        .map_collect(|&x, &y| p.apply_f64(x as f64 / 7.0, y as f64))
                        .into_iter()
                        .collect();
                    let taken = binary(op, &fx, &fy, &dims, result);
                    if let Some(got) = &taken {
                        fast += 1;
                        assert_eq!(got.shape(), &dims[..]);
                        let got: Vec<f64> = got.f64().iter().copied().collect();
                        assert!(
                            got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                            "f64 {op:?} {a:?} {b:?}"
                        );
                    }
                    let Some(_) = p.apply_int(1, 1) else { continue };
                    for dtype in [DType::I64, DType::I32] {
                        let (ix, iy) = (Value::I64(x.clone()).cast(dtype), Value::I64(y.clone()).cast(dtype));
                        let result = if truth { DType::Bool } else { dtype };
                        let want: Vec<i64> = Zip::from(&xb)
                            .and(&yb)
                            .map_collect(|&x, &y| p.apply_int(x, y).unwrap())
                            .into_iter()
                            .collect();
                        let Some(got) = binary(op, &ix, &iy, &dims, result) else {
                            assert!(taken.is_none(), "{dtype:?} {op:?} {a:?} {b:?}: f64 takes it");
                            continue;
                        };
                        let got: Vec<i64> = got.f64().iter().map(|&v| v as i64).collect();
                        assert_eq!(got, want, "{dtype:?} {op:?} {a:?} {b:?}");
                    }
                }
            }
        }
        // Every pair but those with a [17, 1, 101].
        assert!(fast >= 5 * 60, "{fast}");
        let row = f64s(&[1, 4], vec![1.0; 4]);
        let odd = f64s(&[3, 1, 4], vec![2.0; 12]);
        assert!(binary(BinaryOp::Add, &odd, &row, &[3, 1, 4], DType::F64).is_some());
        assert!(binary(BinaryOp::Add, &f64s(&[3, 1, 1], vec![1.0; 3]), &row, &[3, 1, 4], DType::F64).is_some());
        // A value spread over an axis between two of its own is not this way.
        assert!(binary(
            BinaryOp::Add,
            &f64s(&[3, 1, 4], vec![2.0; 12]),
            &f64s(&[3, 5, 4], vec![1.0; 60]),
            &[3, 5, 4],
            DType::F64
        )
        .is_none());
    }

    /// `where` over every layout this way takes (and some it leaves to the general way),
    /// in several dtypes, split over the team: the general way's elements.
    #[test]
    fn where_of_every_layout_gives_the_general_ways_elements() {
        use crate::backend::cpu::value::select_by_broadcast;
        // Past one thread's stretch, so the loop splits over a team of two.
        threads::use_threads(2, std::time::Duration::from_micros(200)).unwrap();
        let dims = [16usize, 50, 100];
        let shapes: [&[usize]; 8] =
            [&[], &[1], &[100], &[50, 100], &[1, 50, 100], &[16, 50, 100], &[16, 1, 100], &[16, 50, 1]];
        let filled = |shape: &[usize], seed: usize, dtype: DType| {
            let n: usize = shape.iter().product();
            let v: Vec<f64> = (0..n).map(|i| ((i * 7919 + seed * 104_729) % 1013) as f64 - 500.0).collect();
            Value::F64(array(shape, v)).cast(dtype)
        };
        let mut tiled = 0;
        for dtype in [DType::F32, DType::F64, DType::I32, DType::BF16, DType::Bool] {
            for (i, c) in shapes.iter().enumerate() {
                for (j, t) in shapes.iter().enumerate() {
                    // Each on-false shape with a few pairs, so the loop stays small.
                    let f = shapes[(i * 3 + j) % shapes.len()];
                    let Value::Bool(cond) = filled(c, i, DType::I64).cast(DType::Bool) else { unreachable!() };
                    let (t, f) = (filled(t, j + 1, dtype), filled(f, i + j + 2, dtype));
                    let want = select_by_broadcast(&cond, &t, &f, &dims, dtype);
                    if let Some(got) = select(&cond, &t, &f, &dims) {
                        tiled += 1;
                        assert_eq!(
                            got.to_elements(),
                            want.to_elements(),
                            "{dtype:?} {c:?} {:?} {:?}",
                            t.shape(),
                            f.shape()
                        );
                        assert_eq!(got.shape(), &dims[..]);
                    }
                }
            }
        }
        // Most triples are tiled (the last two shapes are not).
        assert!(tiled >= 100, "{tiled}");
    }
}
