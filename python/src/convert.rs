//! Data across the boundary: dtype names as Python spells them (`"float32"`, as NumPy and the
//! Python GT do), NumPy arrays into tensor elements and tensor reads out as NumPy arrays, one
//! copy each way and no Python loop.

use gt_ir::data::Elements;
use gt_ir::{DType, HostTensor};
use half::{bf16, f16};
use numpy::{PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// The Python name of a dtype.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F64 => "float64",
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::Bool => "bool",
    }
}

/// A dtype from its Python name (what `gt._dtype` normalises every spelling to).
pub fn dtype_from(name: &str) -> PyResult<DType> {
    DType::ALL.into_iter().find(|d| dtype_name(*d) == name || d.name() == name).ok_or_else(|| {
        let known: Vec<&str> = DType::ALL.iter().map(|d| dtype_name(*d)).collect();
        pyo3::exceptions::PyTypeError::new_err(format!("unknown dtype {name:?}: gt has {}", known.join(", ")))
    })
}

/// The elements and shape of a C-contiguous, native-order NumPy array whose dtype is named
/// `dtype` (`gt._array` converts every other array first).
pub fn elements_of(array: &Bound<'_, PyAny>, dtype: DType) -> PyResult<(Elements, Vec<usize>)> {
    fn take<T: numpy::Element + Copy>(a: &Bound<'_, PyAny>) -> PyResult<(Vec<T>, Vec<usize>)> {
        let a: PyReadonlyArrayDyn<'_, T> = a.extract()?;
        let shape = a.shape().to_vec();
        let data = match a.as_slice() {
            Ok(s) => s.to_vec(),
            // Strided views read in logical order.
            Err(_) => a.as_array().iter().copied().collect(),
        };
        Ok((data, shape))
    }
    Ok(match dtype {
        DType::F64 => take::<f64>(array).map(|(v, s)| (Elements::from(v), s))?,
        DType::F32 => take::<f32>(array).map(|(v, s)| (Elements::from(v), s))?,
        DType::F16 => take::<f16>(array).map(|(v, s)| (Elements::from(v), s))?,
        DType::I64 => take::<i64>(array).map(|(v, s)| (Elements::from(v), s))?,
        DType::I32 => take::<i32>(array).map(|(v, s)| (Elements::from(v), s))?,
        DType::Bool => take::<bool>(array).map(|(v, s)| (Elements::from(v), s))?,
        DType::BF16 => {
            // NumPy has no bfloat16: the array holds float32 values, rounded once here.
            let (v, s) = take::<f32>(array)?;
            (Elements::from(v.into_iter().map(bf16::from_f32).collect::<Vec<_>>()), s)
        }
    })
}

/// A read tensor as a NumPy array of its dtype (`bfloat16`, which NumPy lacks, as float32).
pub fn to_numpy<'py>(py: Python<'py>, host: HostTensor) -> PyResult<Bound<'py, PyAny>> {
    let dims: Vec<usize> = host.ty.shape.dims().to_vec();
    fn shaped<'py, T: numpy::Element>(py: Python<'py>, v: Vec<T>, dims: &[usize]) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyArray1::from_vec(py, v).reshape(dims)?.into_any())
    }
    match host.data {
        Elements::F64(v) => shaped(py, v, &dims),
        Elements::F32(v) => shaped(py, v, &dims),
        Elements::F16(v) => shaped(py, v, &dims),
        Elements::BF16(v) => shaped(py, v.into_iter().map(f32::from).collect::<Vec<_>>(), &dims),
        Elements::I64(v) => shaped(py, v, &dims),
        Elements::I32(v) => shaped(py, v, &dims),
        Elements::Bool(v) => shaped(py, v, &dims),
    }
}
