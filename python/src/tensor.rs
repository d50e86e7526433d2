//! `gt.Tensor`: a Python handle on a Rust [`Tensor`] of the thread's context, with the
//! operators, methods and properties of the Python GT's tensor (and PyTorch's spellings
//! where they differ), and the functions that make tensors.

use crate::convert::{dtype_from, dtype_name, elements_of, to_numpy};
use crate::errors::{index_error, value_error, OrRaise};
use crate::owned::Owned;
use crate::runtime;
use gt_frontend::tensor::{self as api, Arg};
use gt_frontend::{Tensor, TensorError};
use gt_ir::{BinaryOp, DType, HostTensor, SliceItem, UnaryOp};
use pyo3::basic::CompareOp;
use pyo3::exceptions::{PyIndexError, PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyEllipsis, PyFloat, PyInt, PyList, PySlice, PyTuple};

/// A tensor held by gt's workers. Made by `gt.tensor`, `gt.randn`, ... and by every op; its
/// value is freed when the last reference goes. Belongs to the thread that made it.
#[pyclass(name = "Tensor", module = "gt", weakref)]
pub struct PyTensor {
    inner: Owned<Tensor>,
}

impl PyTensor {
    pub(crate) fn new(t: Tensor) -> PyTensor {
        PyTensor { inner: Owned::new(t, "tensor") }
    }

    /// The Rust tensor (on its own thread).
    pub(crate) fn rs(&self) -> PyResult<&Tensor> {
        self.inner.get()
    }
}

/// Moves a value into a closure that runs while the GIL is released.
struct SameThread<T>(T);
// SAFETY: `Python::detach` runs its closure on the calling thread, and the value (an `Rc`
// handle) is used and dropped there only; nothing else can reach it meanwhile, as every
// `unsendable` object refuses other threads.
#[allow(unsafe_code)]
unsafe impl<T> Send for SameThread<T> {}

/// Reads a tensor's value with the GIL released, so that other Python threads run meanwhile.
pub(crate) fn fetch(py: Python<'_>, t: &Tensor) -> PyResult<HostTensor> {
    let t = SameThread(t.clone());
    let got = py.detach(move || {
        let t = t;
        SameThread(t.0.to_host())
    });
    got.0.py()
}

/// `gt._as_tensor`, the Python function that turns lists and arrays into tensors.
static AS_TENSOR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `_gt._register_as_tensor(fn)`.
#[pyfunction]
pub fn _register_as_tensor(py: Python<'_>, f: Py<PyAny>) {
    let _ = AS_TENSOR.set(py, f);
}

/// A Python or NumPy number beside a tensor, in PyTorch's categories (bool < int < float):
/// the category decides the result's dtype, not the value (`t * 1.0` is a float, as in
/// PyTorch, where `.gtir`'s untyped scalars would count an integral `1.0` as an integer).
#[derive(Clone, Copy)]
enum Number {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(x) => write!(f, "{x:?}"),
        }
    }
}

impl Number {
    /// The dtype a tensor of `dtype` converts to before meeting this number, when the number's
    /// category is the higher (PyTorch's defaults: float32 for a float, int64 for an int beside
    /// a bool tensor); `None` when the tensor's dtype wins.
    fn raises(self, dtype: DType) -> Option<DType> {
        match self {
            Number::Float(_) if !dtype.is_float() => Some(DType::F32),
            Number::Int(_) if dtype == DType::Bool => Some(DType::I64),
            _ => None,
        }
    }

    /// A 0-d tensor of the number's own dtype (bool, int64 or float32, PyTorch's).
    fn tensor(self) -> PyResult<Tensor> {
        match self {
            Number::Bool(b) => api::from_data(vec![b], &[]),
            Number::Int(i) => api::from_data(vec![i], &[]),
            Number::Float(x) => api::from_data(vec![x as f32], &[]),
        }
        .py()
    }
}

/// The other operand of an operator, as Python gave it.
enum Other {
    Tensor(Tensor),
    Number(Number),
}

/// An operand ready for the op: a tensor, or a scalar the op converts to its dtype.
enum Operand {
    Tensor(Tensor),
    Scalar(f64),
}

impl Operand {
    fn arg(&self) -> Arg<'_> {
        match self {
            Operand::Tensor(t) => Arg::Tensor(t),
            Operand::Scalar(s) => Arg::Scalar(*s),
        }
    }
}

/// An int scalar: PyTorch takes the ones that fit int64 (and refuses others, whatever the
/// tensor's dtype).
fn int_scalar(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    obj.extract::<i64>().map_err(|_| {
        PyOverflowError::new_err(format!(
            "integer scalar {obj} is beyond the int64 range, which gt (as PyTorch) takes scalars in"
        ))
    })
}

/// A Python number, or a NumPy scalar (or 0-d array) by its dtype's kind.
fn number(obj: &Bound<'_, PyAny>) -> PyResult<Option<Number>> {
    if obj.is_instance_of::<PyBool>() {
        return Ok(Some(Number::Bool(obj.is_truthy()?)));
    }
    if obj.is_instance_of::<PyInt>() {
        return int_scalar(obj).map(|i| Some(Number::Int(i)));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Some(Number::Float(obj.extract::<f64>()?)));
    }
    let np_scalar = obj.hasattr("dtype")? && obj.getattr("ndim").and_then(|n| n.extract::<usize>()).ok() == Some(0);
    if !np_scalar {
        return Ok(None);
    }
    let Ok(kind) = obj.getattr("dtype").and_then(|d| d.getattr("kind")).and_then(|k| k.extract::<String>()) else {
        return Ok(None);
    };
    Ok(match kind.as_str() {
        "b" => Some(Number::Bool(obj.is_truthy()?)),
        "i" | "u" => Some(Number::Int(int_scalar(obj)?)),
        "f" => Some(Number::Float(obj.extract::<f64>()?)),
        _ => None,
    })
}

/// A tensor, a Python or NumPy number, or (through `gt._as_tensor`) a list or an array;
/// `None` for anything else (the operator then answers `NotImplemented`).
fn operand(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Option<Other>> {
    if let Ok(t) = obj.cast::<PyTensor>() {
        return Ok(Some(Other::Tensor(t.borrow().rs()?.clone())));
    }
    if let Some(n) = number(obj)? {
        return Ok(Some(Other::Number(n)));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() || obj.hasattr("__array_interface__")? {
        if let Some(f) = AS_TENSOR.get(py) {
            let t = f.bind(py).call1((obj,))?;
            return Ok(Some(Other::Tensor(t.cast::<PyTensor>()?.borrow().rs()?.clone())));
        }
    }
    Ok(None)
}

/// `t` and a number beside it, paired as PyTorch pairs them (see [`Number::raises`]): gives
/// the tensor to compute with and the number as an operand of its dtype. An int must fit the
/// integer dtype it meets (a `GtValueError` otherwise, as `gt.full` gives), rather than wrap;
/// a comparison (`compare`), whose result is bool whatever it computes in, widens an int32
/// tensor instead, so `t == 2**40` is exact.
fn beside(t: &Tensor, n: Number, compare: bool) -> PyResult<(Tensor, Operand)> {
    let wide = |i: i64| compare && t.dtype() == DType::I32 && i32::try_from(i).is_err();
    let t = match (n.raises(t.dtype()), n) {
        (Some(d), _) => t.to(d).py()?,
        (None, Number::Int(i)) if wide(i) => t.to(DType::I64).py()?,
        (None, _) => t.clone(),
    };
    let operand = match n {
        // `.gtir` scalars have no type (an integral one counts as an integer): a bool beside a
        // bool tensor goes as a bool tensor, so the op sees two bools, as in PyTorch.
        Number::Bool(_) if t.dtype() == DType::Bool => Operand::Tensor(n.tensor()?),
        Number::Bool(b) => Operand::Scalar(if b { 1.0 } else { 0.0 }),
        Number::Int(i) if t.dtype() == DType::I32 && i32::try_from(i).is_err() => {
            return Err(value_error(format!(
                "integer scalar {i} is beyond the range of the int32 tensor it meets; \
                 convert the tensor first (`t.long()`)"
            )));
        }
        // Scalars are held as f64, which rounds an int beyond 2^53: such an int goes as an
        // int64 tensor, exact.
        Number::Int(i) if t.dtype().is_integer() && i.unsigned_abs() > 1 << 53 => Operand::Tensor(n.tensor()?),
        Number::Int(i) => Operand::Scalar(i as f64),
        Number::Float(x) => Operand::Scalar(x),
    };
    Ok((t, operand))
}

/// `t` and the other operand of `op` (`None` for `where`), ready for it.
fn pair(t: &Tensor, other: Other, op: Option<BinaryOp>) -> PyResult<(Tensor, Operand)> {
    match other {
        Other::Tensor(o) => Ok((t.clone(), Operand::Tensor(o))),
        Other::Number(n) => beside(t, n, op.is_some_and(|op| op.is_comparison())),
    }
}

/// One axis or several (`1`, `(0, 2)`, `[0, 2]`).
fn axes_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let one = |a: &Bound<'_, PyAny>| -> PyResult<i64> {
        if let Ok(i) = a.extract::<i64>() {
            return Ok(i);
        }
        if a.is_instance_of::<PyInt>() {
            return Err(value_error(format!("axis {a} is out of range")));
        }
        Err(PyTypeError::new_err(format!(
            "axis: expected an int or a tuple of ints, got {} {}",
            type_name(a),
            a.repr()?
        )))
    };
    if obj.is_instance_of::<PyTuple>() || obj.is_instance_of::<PyList>() {
        return obj.try_iter()?.map(|a| one(&a?)).collect();
    }
    one(obj).map(|a| vec![a])
}

/// The name of an object's type, for messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
}

/// A size or count argument (`what` names it): an int from `min` up; any other value is an
/// error naming it, rather than a conversion error.
pub(crate) fn size_arg(what: &str, obj: &Bound<'_, PyAny>, min: i64) -> PyResult<usize> {
    let Ok(index) = obj.call_method0("__index__") else {
        return Err(PyTypeError::new_err(format!("{what} must be an int, got {} {}", type_name(obj), obj.repr()?)));
    };
    match index.extract::<i64>() {
        Ok(v) if v >= min => Ok(v as usize),
        Ok(v) => Err(value_error(format!("{what} must be at least {min}, got {v}"))),
        Err(_) if index.lt(0)? => Err(value_error(format!("{what} must be at least {min}, got {index}"))),
        Err(_) => Err(value_error(format!("{what} {index} is too large"))),
    }
}

/// A shape given as `f(2, 3)`, `f((2, 3))` or `f([2, 3])`.
pub(crate) fn dims_of(args: &Bound<'_, PyTuple>) -> PyResult<Vec<i64>> {
    if args.len() == 1 {
        let first = args.get_item(0)?;
        if first.is_instance_of::<PyTuple>() || first.is_instance_of::<PyList>() {
            return first.extract::<Vec<i64>>();
        }
    }
    args.extract::<Vec<i64>>()
}

/// A slice's bound or step: beyond i64 it clamps, as Python, NumPy and PyTorch clamp bounds
/// no axis reaches (`t[:2**63]`); gt resolves bounds without overflow.
fn slice_part(v: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if v.is_none() {
        return Ok(None);
    }
    match v.extract::<i64>() {
        Ok(i) => Ok(Some(i)),
        Err(e) => match v.call_method0("__index__") {
            Ok(i) => Ok(Some(if i.lt(0)? { i64::MIN } else { i64::MAX })),
            Err(_) => Err(e),
        },
    }
}

/// The items of a NumPy basic index.
fn index_items(py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Vec<SliceItem>> {
    let items: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
        Ok(t) => t.iter().collect(),
        Err(_) => vec![key.clone()],
    };
    items
        .iter()
        .map(|item| {
            if item.is_none() {
                Ok(SliceItem::NewAxis)
            } else if item.is(PyEllipsis::get(py)) {
                Ok(SliceItem::Ellipsis)
            } else if let Ok(s) = item.cast::<PySlice>() {
                let part = |name: &str| slice_part(&s.getattr(name)?);
                let step = part("step")?.unwrap_or(1);
                if step == 0 {
                    return Err(value_error("slice step cannot be zero".into()));
                }
                Ok(SliceItem::Range { start: part("start")?, end: part("stop")?, step })
            } else if item.is_instance_of::<PyBool>() || item.cast::<PyTensor>().is_ok() {
                Err(PyTypeError::new_err(
                    "gt indexes with ints, slices, None and ... (NumPy's basic indexing); boolean and tensor indices are not supported",
                ))
            } else if let Ok(i) = item.extract::<i64>() {
                Ok(SliceItem::Index(i))
            } else if item.is_instance_of::<PyInt>() {
                Err(index_error(format!("index {item} is out of range")))
            } else {
                Err(PyTypeError::new_err(format!(
                    "cannot index a tensor with {}: use ints, slices, None and ...",
                    item.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                )))
            }
        })
        .collect()
}

fn wrap(t: Tensor) -> PyTensor {
    PyTensor::new(t)
}

fn wrap_all(ts: Vec<Tensor>) -> Vec<PyTensor> {
    ts.into_iter().map(wrap).collect()
}

/// Runs an in-place update; a leaf that requires grad is updated outside autograd (as the
/// Python GT's `param -= lr * grad` does).
fn in_place(t: &Tensor, f: impl FnOnce(&Tensor) -> Result<(), gt_frontend::TensorError>) -> PyResult<()> {
    let _off = (t.is_leaf() && t.requires_grad()).then(api::no_grad);
    f(t).py()
}

/// A reduction's axes from `axis=` or PyTorch's `dim=`.
fn reduce_args(
    axis: Option<&Bound<'_, PyAny>>,
    dim: Option<&Bound<'_, PyAny>>,
    keepdims: bool,
    keepdim: Option<bool>,
) -> PyResult<(Option<Vec<i64>>, bool)> {
    let axes = axis.or(dim).filter(|a| !a.is_none()).map(axes_of).transpose()?;
    Ok((axes, keepdim.unwrap_or(keepdims)))
}

/// A reduction over every element (`Tensor::sum`) ...
type ReduceAll = fn(&Tensor) -> Result<Tensor, TensorError>;
/// ... and over some axes (`Tensor::sum_dims`).
type ReduceDims = fn(&Tensor, &[i64], bool) -> Result<Tensor, TensorError>;

impl PyTensor {
    fn reduce(&self, all: ReduceAll, dims: ReduceDims, (axes, keep): (Option<Vec<i64>>, bool)) -> PyResult<PyTensor> {
        let t = self.rs()?;
        match axes {
            None if !keep => all(t),
            None => dims(t, &(0..t.rank() as i64).collect::<Vec<_>>(), true),
            Some(a) => dims(t, &a, keep),
        }
        .py()
        .map(wrap)
    }

    fn binary(&self, py: Python<'_>, op: BinaryOp, other: &Bound<'_, PyAny>, reflected: bool) -> PyResult<Py<PyAny>> {
        let Some(o) = operand(py, other)? else { return Ok(py.NotImplemented()) };
        let (t, o) = pair(self.rs()?, o, Some(op))?;
        let (l, r) = if reflected { (o.arg(), Arg::Tensor(&t)) } else { (Arg::Tensor(&t), o.arg()) };
        let t = api::binary(op, l, r).py()?;
        Ok(Bound::new(py, wrap(t))?.into_any().unbind())
    }

    fn binary_or_raise(&self, py: Python<'_>, op: BinaryOp, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let Some(o) = operand(py, other)? else {
            return Err(PyTypeError::new_err(format!(
                "{}: expected a tensor or a number, got {}",
                op.mnemonic(),
                type_name(other)
            )));
        };
        let (t, o) = pair(self.rs()?, o, Some(op))?;
        api::binary(op, Arg::Tensor(&t), o.arg()).py().map(wrap)
    }

    fn update(&self, py: Python<'_>, op: BinaryOp, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some(o) = operand(py, other)? else {
            return Err(PyTypeError::new_err(format!(
                "in-place {}: expected a tensor or a number, got {}",
                op.mnemonic(),
                type_name(other)
            )));
        };
        let o = match o {
            Other::Tensor(o) => Operand::Tensor(o),
            // A number of a higher category would change the tensor's dtype: PyTorch refuses
            // that in place, and so does gt (before converting anything).
            Other::Number(n) => match n.raises(self.rs()?.dtype()) {
                Some(d) => {
                    let symbol = match op {
                        BinaryOp::Add => "+",
                        BinaryOp::Sub => "-",
                        BinaryOp::Mul => "*",
                        _ => "/",
                    };
                    return Err(value_error(format!(
                        "in-place {}: {n} with a {} tensor gives {}, which the tensor cannot hold \
                         (as in PyTorch); write `x = x {symbol} {n}`",
                        op.mnemonic(),
                        dtype_name(self.rs()?.dtype()),
                        dtype_name(d)
                    )));
                }
                None => beside(self.rs()?, n, false)?.1,
            },
        };
        in_place(self.rs()?, |t| match op {
            BinaryOp::Add => t.add_assign(o.arg()),
            BinaryOp::Sub => t.sub_assign(o.arg()),
            BinaryOp::Mul => t.mul_assign(o.arg()),
            _ => t.div_assign(o.arg()),
        })
    }

    fn one_value(&self, py: Python<'_>, what: &str) -> PyResult<HostTensor> {
        if self.rs()?.numel() != 1 {
            return Err(value_error(format!(
                "{what} of a tensor of {} elements (shape {:?}) is ambiguous: it needs exactly one",
                self.rs()?.numel(),
                self.rs()?.shape()
            )));
        }
        fetch(py, self.rs()?)
    }
}

#[pymethods]
impl PyTensor {
    /// NumPy defers to gt in mixed expressions (`array + tensor` is a tensor).
    #[classattr]
    #[allow(non_upper_case_globals)]
    const __array_priority__: f64 = 1000.0;

    /// The dimensions.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.rs()?.shape())
    }

    /// The element type's name (`"float32"`, ...; compare with `gt.float32`).
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(dtype_name(self.rs()?.dtype()))
    }

    /// Number of axes.
    #[getter]
    fn ndim(&self) -> PyResult<usize> {
        Ok(self.rs()?.rank())
    }

    /// Number of axes (PyTorch's spelling).
    fn dim(&self) -> PyResult<usize> {
        Ok(self.rs()?.rank())
    }

    /// Number of elements.
    fn numel(&self) -> PyResult<usize> {
        Ok(self.rs()?.numel())
    }

    /// The dimensions, or one of them.
    #[pyo3(signature = (dim=None))]
    fn size<'py>(&self, py: Python<'py>, dim: Option<i64>) -> PyResult<Bound<'py, PyAny>> {
        match dim {
            None => Ok(PyTuple::new(py, self.rs()?.shape())?.into_any()),
            Some(d) => {
                let r = self.rs()?.rank() as i64;
                let i = if d < 0 { d + r } else { d };
                if !(0..r).contains(&i) {
                    return Err(PyIndexError::new_err(format!("dim {d} out of range for a tensor of rank {r}")));
                }
                Ok(self.rs()?.shape()[i as usize].into_pyobject(py)?.into_any())
            }
        }
    }

    /// The value's id in this thread's instruction stream (what logs and dumps show).
    #[getter]
    fn id(&self) -> PyResult<usize> {
        Ok(self.rs()?.id().index())
    }

    /// Whether gradients flow to (or through) it.
    #[getter]
    fn get_requires_grad(&self) -> PyResult<bool> {
        Ok(self.rs()?.requires_grad())
    }

    #[setter]
    fn set_requires_grad(&self, on: bool) -> PyResult<()> {
        track(self.rs()?.clone(), on).map(|_| ())
    }

    /// Makes a leaf track gradients (or stop); returns the tensor.
    #[pyo3(signature = (requires_grad=true))]
    fn requires_grad_(slf: PyRef<'_, Self>, requires_grad: bool) -> PyResult<PyRef<'_, Self>> {
        track(slf.rs()?.clone(), requires_grad)?;
        Ok(slf)
    }

    /// Whether the user made it (not a recorded op): only leaves keep a gradient.
    #[getter]
    fn is_leaf(&self) -> PyResult<bool> {
        Ok(self.rs()?.is_leaf())
    }

    /// The accumulated gradient after `backward()` (`None` before; accumulates as PyTorch).
    #[getter]
    fn get_grad(&self) -> PyResult<Option<PyTensor>> {
        Ok(self.rs()?.grad().map(wrap))
    }

    /// `t.grad = None` forgets the gradient.
    #[setter]
    fn set_grad(&self, grad: Option<PyRef<'_, PyTensor>>) -> PyResult<()> {
        match grad {
            None => {
                self.rs()?.zero_grad();
                Ok(())
            }
            Some(_) => {
                Err(PyTypeError::new_err("only `tensor.grad = None` may be assigned; gradients come from backward()"))
            }
        }
    }

    /// This value, outside the autograd graph (PyTorch's `.data`); `.data.numpy()` reads it
    /// as the Python GT's `.data.numpy()` does. A handle of its own: an in-place op on it does
    /// not reach this tensor, but assigning `.data` does (`w.data -= lr * g`, `w.data = t`).
    #[getter]
    fn data(&self) -> PyResult<PyTensor> {
        Ok(wrap(self.rs()?.detach()))
    }

    /// Takes `value`'s value (same dtype and shape) in place, outside the autograd graph.
    #[setter]
    fn set_data(&self, value: PyRef<'_, PyTensor>) -> PyResult<()> {
        let _off = api::no_grad();
        self.rs()?.assign(&value.rs()?.detach()).py()
    }

    /// A tensor sharing this value, outside the autograd graph.
    fn detach(&self) -> PyResult<PyTensor> {
        Ok(wrap(self.rs()?.detach()))
    }

    /// A copy (gradients flow through it).
    fn clone(&self) -> PyResult<PyTensor> {
        let dims: Vec<i64> = self.rs()?.shape().iter().map(|&d| d as i64).collect();
        self.rs()?.reshape(&dims).py().map(wrap)
    }

    /// The values as a NumPy array of its dtype (a sync point; `bfloat16` reads as float32).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_numpy(py, fetch(py, self.rs()?)?)
    }

    /// NumPy's conversion protocol: `np.asarray(t)`.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = copy;
        let a = self.numpy(py)?;
        match dtype {
            Some(d) if !d.is_none() => a.call_method1("astype", (d,)),
            _ => Ok(a),
        }
    }

    /// Nested lists of Python numbers.
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.numpy(py)?.call_method0("tolist")
    }

    /// The one value of a one-element tensor, as a Python number (a sync point).
    fn item<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let host = self.one_value(py, "item()")?;
        to_numpy(py, host)?.call_method0("item")
    }

    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        self.item(py)?.extract::<f64>()
    }

    fn __int__(&self, py: Python<'_>) -> PyResult<i64> {
        let v = self.item(py)?;
        v.call_method0("__int__")?.extract::<i64>()
    }

    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        self.item(py)?.is_truthy()
    }

    fn __len__(&self) -> PyResult<usize> {
        self.rs()?.shape().first().copied().ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __iter__<'py>(slf: PyRef<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let n = slf.__len__()?;
        let rows: Vec<PyTensor> =
            (0..n).map(|i| slf.rs()?.slice(&[SliceItem::Index(i as i64)]).py().map(wrap)).collect::<PyResult<_>>()?;
        Ok(PyList::new(py, rows)?.try_iter()?.into_any())
    }

    fn __hash__(slf: PyRef<'_, Self>) -> isize {
        // Identity, as PyTorch's tensors (`==` builds a tensor, so values cannot hash).
        slf.as_ptr() as isize
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let t = self.rs()?;
        let dtype = dtype_name(t.dtype());
        let text = fetch(py, t).and_then(|host| {
            let array = to_numpy(py, host)?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("threshold", 10)?;
            kwargs.set_item("edgeitems", 3)?;
            kwargs.set_item("precision", 4)?;
            kwargs.set_item("suppress_small", true)?;
            kwargs.set_item("separator", ", ")?;
            kwargs.set_item("prefix", "tensor(")?;
            py.import("numpy")?.call_method("array2string", (array,), Some(&kwargs))?.extract::<String>()
        });
        let grad = if t.requires_grad() { ", requires_grad=True" } else { "" };
        Ok(match text {
            Ok(values) => format!("tensor({values}, dtype={dtype}{grad})"),
            Err(e) => {
                format!("Tensor(id={}, shape={:?}, dtype={dtype}{grad}, unreadable: {e})", t.id().index(), t.shape())
            }
        })
    }

    fn __str__(&self, py: Python<'_>) -> PyResult<String> {
        self.__repr__(py)
    }

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let index = index_items(py, key)?;
        self.rs()?.slice(&index).py().map(wrap)
    }

    fn __add__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Add, o, false)
    }
    fn __radd__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Add, o, true)
    }
    fn __sub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Sub, o, false)
    }
    fn __rsub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Sub, o, true)
    }
    fn __mul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Mul, o, false)
    }
    fn __rmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Mul, o, true)
    }
    fn __truediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Div, o, false)
    }
    fn __rtruediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.binary(py, BinaryOp::Div, o, true)
    }
    fn __pow__(&self, py: Python<'_>, o: &Bound<'_, PyAny>, modulo: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let _ = modulo;
        self.binary(py, BinaryOp::Pow, o, false)
    }
    fn __rpow__(&self, py: Python<'_>, o: &Bound<'_, PyAny>, modulo: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let _ = modulo;
        self.binary(py, BinaryOp::Pow, o, true)
    }
    fn __matmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match operand(py, o)? {
            Some(Other::Tensor(r)) => Ok(Bound::new(py, wrap(self.rs()?.matmul(&r).py()?))?.into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }
    fn __rmatmul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match operand(py, o)? {
            Some(Other::Tensor(l)) => Ok(Bound::new(py, wrap(l.matmul(self.rs()?).py()?))?.into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }
    fn __neg__(&self) -> PyResult<PyTensor> {
        self.rs()?.neg().py().map(wrap)
    }
    fn __pos__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }
    fn __abs__(&self) -> PyResult<PyTensor> {
        self.rs()?.abs().py().map(wrap)
    }
    fn __richcmp__(&self, py: Python<'_>, o: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let op = match op {
            CompareOp::Lt => BinaryOp::Lt,
            CompareOp::Le => BinaryOp::Le,
            CompareOp::Eq => BinaryOp::Eq,
            CompareOp::Ne => BinaryOp::Ne,
            CompareOp::Gt => BinaryOp::Gt,
            CompareOp::Ge => BinaryOp::Ge,
        };
        self.binary(py, op, o, false)
    }
    fn __iadd__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<()> {
        self.update(py, BinaryOp::Add, o)
    }
    fn __isub__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<()> {
        self.update(py, BinaryOp::Sub, o)
    }
    fn __imul__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<()> {
        self.update(py, BinaryOp::Mul, o)
    }
    fn __itruediv__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) -> PyResult<()> {
        self.update(py, BinaryOp::Div, o)
    }

    /// Sets every element to zero in place; returns the tensor.
    fn zero_(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        in_place(slf.rs()?, |t| t.zero_())?;
        Ok(slf)
    }

    /// Matrix product.
    fn matmul(&self, other: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.rs()?.matmul(other.rs()?).py().map(wrap)
    }

    /// Elementwise `neg`.
    fn neg(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Neg).py().map(wrap)
    }

    /// Elementwise `abs`.
    fn abs(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Abs).py().map(wrap)
    }

    /// Elementwise `relu`.
    fn relu(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Relu).py().map(wrap)
    }

    /// Elementwise `sigmoid`.
    fn sigmoid(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Sigmoid).py().map(wrap)
    }

    /// Elementwise `tanh`.
    fn tanh(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Tanh).py().map(wrap)
    }

    /// Elementwise `exp`.
    fn exp(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Exp).py().map(wrap)
    }

    /// Elementwise `log`.
    fn log(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Log).py().map(wrap)
    }

    /// Elementwise `sqrt`.
    fn sqrt(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Sqrt).py().map(wrap)
    }

    /// Elementwise `rsqrt`.
    fn rsqrt(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Rsqrt).py().map(wrap)
    }

    /// Elementwise `erf`.
    fn erf(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Erf).py().map(wrap)
    }

    /// Elementwise `softplus`.
    fn softplus(&self) -> PyResult<PyTensor> {
        self.rs()?.unary(UnaryOp::Softplus).py().map(wrap)
    }

    /// Elementwise `add` with NumPy broadcasting (a tensor or a number).
    fn add(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Add, other)
    }

    /// Elementwise `sub` with NumPy broadcasting (a tensor or a number).
    fn sub(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Sub, other)
    }

    /// Elementwise `mul` with NumPy broadcasting (a tensor or a number).
    fn mul(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Mul, other)
    }

    /// Elementwise `div` with NumPy broadcasting (a tensor or a number).
    fn div(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Div, other)
    }

    /// Elementwise `pow` with NumPy broadcasting (a tensor or a number).
    fn pow(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Pow, other)
    }

    /// Elementwise `maximum` with NumPy broadcasting (a tensor or a number).
    fn maximum(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Maximum, other)
    }

    /// Elementwise `minimum` with NumPy broadcasting (a tensor or a number).
    fn minimum(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Minimum, other)
    }

    /// Elementwise `eq` with NumPy broadcasting (a tensor or a number).
    fn eq(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Eq, other)
    }

    /// Elementwise `ne` with NumPy broadcasting (a tensor or a number).
    fn ne(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Ne, other)
    }

    /// Elementwise `lt` with NumPy broadcasting (a tensor or a number).
    fn lt(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Lt, other)
    }

    /// Elementwise `le` with NumPy broadcasting (a tensor or a number).
    fn le(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Le, other)
    }

    /// Elementwise `gt` with NumPy broadcasting (a tensor or a number).
    fn gt(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Gt, other)
    }

    /// Elementwise `ge` with NumPy broadcasting (a tensor or a number).
    fn ge(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.binary_or_raise(py, BinaryOp::Ge, other)
    }

    /// Sum over every element, or over `axis` (`dim`).
    #[pyo3(signature = (axis=None, keepdims=false, *, dim=None, keepdim=None))]
    fn sum(
        &self,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: Option<bool>,
    ) -> PyResult<PyTensor> {
        self.reduce(Tensor::sum, Tensor::sum_dims, reduce_args(axis, dim, keepdims, keepdim)?)
    }

    /// Mean over every element, or over `axis` (`dim`).
    #[pyo3(signature = (axis=None, keepdims=false, *, dim=None, keepdim=None))]
    fn mean(
        &self,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: Option<bool>,
    ) -> PyResult<PyTensor> {
        self.reduce(Tensor::mean, Tensor::mean_dims, reduce_args(axis, dim, keepdims, keepdim)?)
    }

    /// Largest element, or largest over `axis` (`dim`): values only.
    #[pyo3(signature = (axis=None, keepdims=false, *, dim=None, keepdim=None))]
    fn max(
        &self,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: Option<bool>,
    ) -> PyResult<PyTensor> {
        self.reduce(Tensor::max, Tensor::max_dims, reduce_args(axis, dim, keepdims, keepdim)?)
    }

    /// Smallest element, or smallest over `axis` (`dim`): values only.
    #[pyo3(signature = (axis=None, keepdims=false, *, dim=None, keepdim=None))]
    fn min(
        &self,
        axis: Option<&Bound<'_, PyAny>>,
        keepdims: bool,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: Option<bool>,
    ) -> PyResult<PyTensor> {
        self.reduce(Tensor::min, Tensor::min_dims, reduce_args(axis, dim, keepdims, keepdim)?)
    }

    /// Same elements, new shape (one dimension may be -1): `reshape(2, 3)` or `reshape((2, 3))`.
    #[pyo3(signature = (*shape))]
    fn reshape(&self, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        self.rs()?.reshape(&dims_of(shape)?).py().map(wrap)
    }

    /// As `reshape` (values are never shared in place, so a view is a reshape).
    #[pyo3(signature = (*shape))]
    fn view(&self, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        self.reshape(shape)
    }

    /// One axis of every element.
    fn flatten(&self) -> PyResult<PyTensor> {
        self.rs()?.reshape(&[-1]).py().map(wrap)
    }

    /// Broadcasts to a shape (-1 keeps a dimension).
    #[pyo3(signature = (*shape))]
    fn expand(&self, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let want = dims_of(shape)?;
        let have = self.rs()?.shape();
        let offset = want.len().saturating_sub(have.len());
        let dims = want
            .iter()
            .enumerate()
            .map(|(i, &d)| match d {
                -1 if i >= offset => Ok(have[i - offset]),
                d if d >= 0 => Ok(d as usize),
                d => Err(value_error(format!("expand: dimension {d} is not a size"))),
            })
            .collect::<PyResult<Vec<usize>>>()?;
        self.rs()?.broadcast_to(&dims).py().map(wrap)
    }

    /// Inserts an axis of size 1.
    fn unsqueeze(&self, dim: i64) -> PyResult<PyTensor> {
        self.rs()?.unsqueeze(dim).py().map(wrap)
    }

    /// Removes one axis of size 1, or every one.
    #[pyo3(signature = (dim=None))]
    fn squeeze(&self, dim: Option<i64>) -> PyResult<PyTensor> {
        match dim {
            Some(d) => self.rs()?.squeeze(d),
            None => self.rs()?.squeeze_all(),
        }
        .py()
        .map(wrap)
    }

    /// Swaps two axes; with none given, the last two (a tensor of rank below 2 as it is).
    #[pyo3(signature = (dim0=None, dim1=None))]
    fn transpose(&self, dim0: Option<i64>, dim1: Option<i64>) -> PyResult<PyTensor> {
        match (dim0, dim1) {
            (None, None) => self.rs()?.t(),
            (Some(a), Some(b)) => self.rs()?.transpose(a, b),
            _ => return Err(value_error("transpose: give both dimensions or neither".into())),
        }
        .py()
        .map(wrap)
    }

    /// The last two axes swapped.
    #[getter(T)]
    fn big_t(&self) -> PyResult<PyTensor> {
        self.rs()?.t().py().map(wrap)
    }

    /// The last two axes swapped.
    fn t(&self) -> PyResult<PyTensor> {
        self.rs()?.t().py().map(wrap)
    }

    /// Reorders axes: `permute(2, 0, 1)` or `permute((2, 0, 1))`.
    #[pyo3(signature = (*dims))]
    fn permute(&self, dims: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        self.rs()?.permute(&dims_of(dims)?).py().map(wrap)
    }

    /// Pieces of `split_size` along `dim` (the last smaller), or of the listed sizes.
    #[pyo3(signature = (split_size, dim=0))]
    fn split(&self, split_size: &Bound<'_, PyAny>, dim: i64) -> PyResult<Vec<PyTensor>> {
        if split_size.is_instance_of::<PyList>() || split_size.is_instance_of::<PyTuple>() {
            let sizes = split_size
                .try_iter()?
                .map(|n| size_arg("split: each of split_size", &n?, 0))
                .collect::<PyResult<Vec<usize>>>()?;
            return self.rs()?.split_sizes(&sizes, dim).py().map(wrap_all);
        }
        let n = size_arg("split: split_size", split_size, 0)?;
        self.rs()?.split(n, dim).py().map(wrap_all)
    }

    /// `chunks` pieces of equal size along `dim` (fewer when the axis is short).
    #[pyo3(signature = (chunks, dim=0))]
    fn chunk(&self, chunks: &Bound<'_, PyAny>, dim: i64) -> PyResult<Vec<PyTensor>> {
        let chunks = size_arg("chunk: chunks", chunks, 1)?;
        self.rs()?.chunk(chunks, dim).py().map(wrap_all)
    }

    /// Converted to `dtype` (`gt.float16`, `"bfloat16"`, ...).
    fn to(&self, py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let name = crate::dtype_arg(py, dtype)?;
        self.rs()?.to(dtype_from(&name)?).py().map(wrap)
    }

    /// As float32.
    fn float(&self) -> PyResult<PyTensor> {
        self.rs()?.to(DType::F32).py().map(wrap)
    }
    /// As float64.
    fn double(&self) -> PyResult<PyTensor> {
        self.rs()?.to(DType::F64).py().map(wrap)
    }
    /// As float16.
    fn half(&self) -> PyResult<PyTensor> {
        self.rs()?.to(DType::F16).py().map(wrap)
    }
    /// As bfloat16.
    fn bfloat16(&self) -> PyResult<PyTensor> {
        self.rs()?.to(DType::BF16).py().map(wrap)
    }
    /// As int32.
    fn int(&self) -> PyResult<PyTensor> {
        self.rs()?.to(DType::I32).py().map(wrap)
    }
    /// As int64.
    fn long(&self) -> PyResult<PyTensor> {
        self.rs()?.to(DType::I64).py().map(wrap)
    }
    /// As bool.
    fn bool(&self) -> PyResult<PyTensor> {
        self.rs()?.to(DType::Bool).py().map(wrap)
    }

    /// Softmax along `dim`.
    #[pyo3(signature = (dim=-1))]
    fn softmax(&self, dim: i64) -> PyResult<PyTensor> {
        gt_frontend::nn::softmax(self.rs()?, dim).py().map(wrap)
    }

    /// Log-softmax along `dim`.
    #[pyo3(signature = (dim=-1))]
    fn log_softmax(&self, dim: i64) -> PyResult<PyTensor> {
        gt_frontend::nn::log_softmax(self.rs()?, dim).py().map(wrap)
    }

    /// Computes the gradient of this one-element tensor (or from `gradient`) for every
    /// leaf that requires grad, adding it to the leaf's `.grad`.
    #[pyo3(signature = (gradient=None))]
    fn backward(&self, gradient: Option<PyRef<'_, PyTensor>>) -> PyResult<()> {
        match gradient {
            Some(g) => self.rs()?.backward_with(g.rs()?),
            None => self.rs()?.backward(),
        }
        .py()
    }
}

/// `gt.from_numpy`'s core: an array already contiguous, native and of a gt dtype (`dtype`).
#[pyfunction]
pub fn _from_array(array: &Bound<'_, PyAny>, dtype: &str, requires_grad: bool) -> PyResult<PyTensor> {
    runtime::context().py()?;
    let (data, shape) = elements_of(array, dtype_from(dtype)?)?;
    let t = api::from_data(data, &shape).py()?;
    finish(t, requires_grad)
}

fn finish(t: Tensor, requires_grad: bool) -> PyResult<PyTensor> {
    let t = if requires_grad { track(t, true)? } else { t };
    Ok(wrap(t))
}

/// `requires_grad_(on)`, refused for integer and bool tensors as PyTorch does (no gradient
/// flows through them).
fn track(t: Tensor, on: bool) -> PyResult<Tensor> {
    if on && !t.dtype().is_float() {
        return Err(value_error(format!(
            "only tensors of a floating-point dtype can require gradients, not {}",
            dtype_name(t.dtype())
        )));
    }
    t.requires_grad_(on).py()
}

fn shape_of(dims: Vec<i64>) -> PyResult<Vec<usize>> {
    dims.into_iter()
        .map(|d| usize::try_from(d).map_err(|_| value_error(format!("a shape needs sizes of at least 0, got {d}"))))
        .collect()
}

/// A creation op of `dtype` (made in f32 and cast when another float is asked for).
fn created(
    make: impl FnOnce() -> Result<Tensor, gt_frontend::TensorError>,
    dtype: &str,
    requires_grad: bool,
) -> PyResult<PyTensor> {
    runtime::context().py()?;
    let want = dtype_from(dtype)?;
    let t = make().py()?;
    let t = if t.dtype() == want { t } else { t.to(want).py()? };
    finish(t, requires_grad)
}

/// `gt.randn`'s core.
#[pyfunction]
pub fn _randn(dims: Vec<i64>, dtype: &str, requires_grad: bool) -> PyResult<PyTensor> {
    let shape = shape_of(dims)?;
    created(|| api::randn(&shape), dtype, requires_grad)
}

/// `gt.rand`'s core.
#[pyfunction]
pub fn _rand(dims: Vec<i64>, dtype: &str, requires_grad: bool) -> PyResult<PyTensor> {
    let shape = shape_of(dims)?;
    created(|| api::rand(&shape), dtype, requires_grad)
}

/// `gt.full`'s core (and `zeros`, `ones`).
#[pyfunction]
pub fn _full(dims: Vec<i64>, value: f64, dtype: &str, requires_grad: bool) -> PyResult<PyTensor> {
    let shape = shape_of(dims)?;
    let d = dtype_from(dtype)?;
    created(|| api::full_dtype(&shape, value, d), dtype, requires_grad)
}

/// `gt.arange`'s core.
#[pyfunction]
pub fn _arange(start: f64, end: f64, step: f64, dtype: &str, requires_grad: bool) -> PyResult<PyTensor> {
    let d = dtype_from(dtype)?;
    created(|| api::arange_dtype(start, end, step, d), dtype, requires_grad)
}

/// `gt.cat`'s core.
#[pyfunction]
pub fn _cat(tensors: Vec<PyRef<'_, PyTensor>>, axis: i64) -> PyResult<PyTensor> {
    let ts: Vec<&Tensor> = tensors.iter().map(|t| t.rs()).collect::<PyResult<_>>()?;
    api::cat(&ts, axis).py().map(wrap)
}

/// `gt.where(cond, a, b)`.
#[pyfunction]
#[pyo3(name = "where")]
pub fn where_(
    py: Python<'_>,
    cond: PyRef<'_, PyTensor>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
) -> PyResult<PyTensor> {
    let bad = || PyTypeError::new_err("where: the branches must be tensors or numbers");
    let a = operand(py, a)?.ok_or_else(bad)?;
    let b = operand(py, b)?.ok_or_else(bad)?;
    // PyTorch's dtypes: a number beside a tensor branch as beside a binary op's tensor; two
    // numbers as 0-d tensors of their own dtypes (`where(c, 1, 0)` is int64).
    let (a, b) = match (a, b) {
        (Other::Tensor(a), b) => {
            let (a, b) = pair(&a, b, None)?;
            (Operand::Tensor(a), b)
        }
        (Other::Number(a), Other::Tensor(b)) => {
            let (b, a) = beside(&b, a, false)?;
            (a, Operand::Tensor(b))
        }
        (Other::Number(a), Other::Number(b)) => (Operand::Tensor(a.tensor()?), Operand::Tensor(b.tensor()?)),
    };
    api::where_(cond.rs()?, a.arg(), b.arg()).py().map(wrap)
}

/// Seeds this thread's random ops. As PyTorch, a seed is an int in [-2^63, 2^64); a
/// negative one counts as its 64-bit two's complement.
#[pyfunction]
pub fn manual_seed(seed: &Bound<'_, PyAny>) -> PyResult<()> {
    let seed = match (seed.extract::<u64>(), seed.extract::<i64>()) {
        (Ok(s), _) => s,
        (_, Ok(s)) => s as u64,
        _ if seed.call_method0("__index__").is_ok() => {
            return Err(value_error(format!("manual_seed: seed {seed} is beyond [-2**63, 2**64)")))
        }
        _ => return Err(PyTypeError::new_err(format!("manual_seed: seed must be an int, got {}", type_name(seed)))),
    };
    runtime::context().py()?;
    api::manual_seed(seed).py()
}

/// Whether this thread records ops for autograd.
#[pyfunction]
pub fn is_grad_enabled() -> PyResult<bool> {
    runtime::context().py()?;
    Ok(api::is_grad_enabled())
}

/// Waits until every op this thread issued has run, raising the first failure.
#[pyfunction]
pub fn synchronize(py: Python<'_>) -> PyResult<()> {
    let ctx = SameThread(runtime::context().py()?);
    let got = py.detach(move || {
        let ctx = ctx;
        SameThread(ctx.0.sync())
    });
    got.0.py()
}

/// The guard of a `gt.autocast(dtype)` block: this thread's ops run in `dtype` until closed.
#[pyclass(module = "gt._gt")]
pub struct Autocast {
    guard: Owned<Option<api::autocast::AutocastGuard>>,
}

#[pymethods]
impl Autocast {
    #[new]
    fn new(dtype: &str) -> PyResult<Autocast> {
        let guard = api::autocast::autocast(crate::convert::dtype_from(dtype)?).py()?;
        Ok(Autocast { guard: Owned::new(Some(guard), "autocast block") })
    }

    /// Ends the block.
    fn close(&mut self) -> PyResult<()> {
        self.guard.get_mut()?.take();
        Ok(())
    }
}

/// The guard of a `gt.no_grad()` block.
#[pyclass(module = "gt._gt")]
pub struct NoGrad {
    guard: Owned<Option<api::NoGradGuard>>,
}

#[pymethods]
impl NoGrad {
    #[new]
    fn new() -> PyResult<NoGrad> {
        let ctx = runtime::context().py()?;
        Ok(NoGrad { guard: Owned::new(Some(ctx.no_grad()), "no_grad block") })
    }

    /// Ends the block.
    fn close(&mut self) -> PyResult<()> {
        self.guard.get_mut()?.take();
        Ok(())
    }
}
