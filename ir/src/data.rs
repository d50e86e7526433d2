//! `HostTensor`: a tensor's type and data on the client side, and its printed form.

use crate::{DType, TensorType};
use half::{bf16, f16};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;

/// A tensor's data on the host, row-major.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTensor {
    /// Its type.
    pub ty: TensorType,
    /// `ty.shape.numel()` elements of `ty.dtype` (on the wire: raw bytes, see [`Elements`]).
    pub data: Elements,
}

/// Tensor elements of one dtype, row-major. On the wire (msgpack) they are the dtype and
/// one byte string of little-endian elements (a `bin`), not an array of numbers: encoding
/// and decoding are copies.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    /// `f64`
    F64(Vec<f64>),
    /// `f32`
    F32(Vec<f32>),
    /// `f16`
    F16(Vec<f16>),
    /// `bf16`
    BF16(Vec<bf16>),
    /// `i64`
    I64(Vec<i64>),
    /// `i32`
    I32(Vec<i32>),
    /// `bool`
    Bool(Vec<bool>),
}

/// Runs `$body` with `$v` bound to the vector inside an [`Elements`], whatever its dtype.
#[macro_export]
macro_rules! each_elements {
    ($e:expr, $v:ident => $body:expr) => {
        match $e {
            $crate::data::Elements::F64($v) => $body,
            $crate::data::Elements::F32($v) => $body,
            $crate::data::Elements::F16($v) => $body,
            $crate::data::Elements::BF16($v) => $body,
            $crate::data::Elements::I64($v) => $body,
            $crate::data::Elements::I32($v) => $body,
            $crate::data::Elements::Bool($v) => $body,
        }
    };
}

/// Bytes that are not whole elements of their dtype.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BytesError {
    /// A length that is not a multiple of the element size.
    #[error("{len} bytes are not whole {dtype} elements ({size} bytes each)")]
    Length {
        /// The dtype.
        dtype: DType,
        /// The byte count.
        len: usize,
        /// Bytes per element.
        size: usize,
    },
    /// A `bool` byte other than 0 or 1.
    #[error("byte {index} is {byte}, not a bool (0 or 1)")]
    Bool {
        /// Its position.
        index: usize,
        /// Its value.
        byte: u8,
    },
}

/// One element of any dtype, as an element converts: what casts and element-by-element
/// comparisons go through.
pub trait Element: Copy + Send + Sync + 'static {
    /// Its dtype.
    const DTYPE: DType;
    /// The value as `f64` (`bool`: 0 or 1; `i64` may round above 2^53).
    fn to_f64(self) -> f64;
    /// A value converted as PyTorch's `.to(dtype)` does: floats to integers truncate toward
    /// zero (saturating, NaN to 0), integers wrap to a narrower integer, anything nonzero
    /// (NaN included) is `true`.
    fn from_f64(x: f64) -> Self;
    /// The value as `i64`, exactly for integers.
    fn to_i64(self) -> i64;
    /// A value from an `i64`, exactly for integers (wrapping to `i32`).
    fn from_i64(x: i64) -> Self;
}

macro_rules! float_element {
    ($t:ty, $d:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn from_f64(x: f64) -> Self {
                $from(x)
            }
            fn to_i64(self) -> i64 {
                $to(self) as i64
            }
            fn from_i64(x: i64) -> Self {
                $from(x as f64)
            }
        }
    };
}
float_element!(f64, F64, |x| x, |x| x);
float_element!(f32, F32, f64::from, |x| x as f32);
float_element!(f16, F16, f64::from, f16_of);
float_element!(bf16, BF16, f64::from, bf16_of);

/// `x` as an `f16` the way PyTorch converts a double: to `f32` first, then rounded to
/// nearest even (two roundings, on every host: `half`'s own `from_f64` rounds twice through
/// F16C where the CPU has it and truncates otherwise; GPU kernels do the same two `cvt`s).
pub fn f16_of(x: f64) -> f16 {
    f16::from_f32(x as f32)
}

/// `x` as a `bf16`, through `f32` as [`f16_of`].
pub fn bf16_of(x: f64) -> bf16 {
    bf16::from_f32(x as f32)
}

impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> Self {
        x as i64
    }
    fn to_i64(self) -> i64 {
        self
    }
    fn from_i64(x: i64) -> Self {
        x
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        // Through i64 so that out-of-range values wrap as an integer would.
        (x as i64) as i32
    }
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    fn from_i64(x: i64) -> Self {
        x as i32
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    fn from_i64(x: i64) -> Self {
        x != 0
    }
}

/// `x` converted to `dtype` as `.to(dtype)` converts it, as an `f64` again: what a scalar
/// operand of an op computing in `dtype` is (a half rounds, an integer truncates).
pub fn converted_scalar(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => f64::from(x as f32),
        DType::F16 => f16_of(x).to_f64(),
        DType::BF16 => bf16_of(x).to_f64(),
        DType::I64 => (x as i64) as f64,
        DType::I32 => f64::from(i32::from_f64(x)),
        DType::Bool => f64::from(u8::from(x != 0.0)),
    }
}

/// The value scalar operand `x` of the binary `op` computing in `dtype` takes, on the right
/// (`rhs`) or the left: [`converted_scalar`], except that a half's `mul` and `div` by a
/// scalar on the right keep it in `f32`, as PyTorch's do (its op math type), so that
/// `h / 1e5` is `h * 1e-5` and not `h / inf`. On the left, and for `add`, `sub`,
/// comparisons and the rest, the scalar rounds to the half, as in PyTorch (`1e5 * h` is
/// `inf`).
pub fn binary_scalar(op: crate::BinaryOp, dtype: DType, x: f64, rhs: bool) -> f64 {
    converted_scalar(if scalar_in_f32(op, dtype, rhs) { DType::F32 } else { dtype }, x)
}

/// Whether [`binary_scalar`] keeps the scalar in `f32` rather than `dtype`.
pub fn scalar_in_f32(op: crate::BinaryOp, dtype: DType, rhs: bool) -> bool {
    rhs && dtype.is_half() && matches!(op, crate::BinaryOp::Mul | crate::BinaryOp::Div)
}

/// Converts `v` element by element (exactly between integers, through `f64` otherwise).
pub fn convert<S: Element, T: Element>(v: &[S]) -> Vec<T> {
    let integral = !S::DTYPE.is_float() && !T::DTYPE.is_float();
    if integral {
        v.iter().map(|&x| T::from_i64(x.to_i64())).collect()
    } else {
        v.iter().map(|&x| T::from_f64(x.to_f64())).collect()
    }
}

impl Elements {
    /// `n` zeros (`false`) of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Elements {
        match dtype {
            DType::F64 => Elements::F64(vec![0.0; n]),
            DType::F32 => Elements::F32(vec![0.0; n]),
            DType::F16 => Elements::F16(vec![f16::ZERO; n]),
            DType::BF16 => Elements::BF16(vec![bf16::ZERO; n]),
            DType::I64 => Elements::I64(vec![0; n]),
            DType::I32 => Elements::I32(vec![0; n]),
            DType::Bool => Elements::Bool(vec![false; n]),
        }
    }

    /// Values given as `f64`s, converted to `dtype` as [`Element::from_f64`] does.
    pub fn from_f64s(dtype: DType, v: &[f64]) -> Elements {
        Elements::F64(v.to_vec()).cast(dtype)
    }

    /// Their dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Elements::F64(_) => DType::F64,
            Elements::F32(_) => DType::F32,
            Elements::F16(_) => DType::F16,
            Elements::BF16(_) => DType::BF16,
            Elements::I64(_) => DType::I64,
            Elements::I32(_) => DType::I32,
            Elements::Bool(_) => DType::Bool,
        }
    }

    /// How many elements.
    pub fn len(&self) -> usize {
        each_elements!(self, v => v.len())
    }

    /// How many bytes the elements take (their little-endian bytes on the wire).
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements when they are `f32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Elements::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements converted to `f32`.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Elements::F32(v) => v.clone(),
            e => each_elements!(e, v => convert(v)),
        }
    }

    /// The elements as `f32`s, moved (not copied) when they already are.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            Elements::F32(v) => v,
            e => e.to_f32(),
        }
    }

    /// The elements converted to `f64`.
    pub fn to_f64(&self) -> Vec<f64> {
        each_elements!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// Every element as `i64`, exactly, for integer and `bool` elements (`None` for floats).
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        if self.dtype().is_float() {
            return None;
        }
        Some(each_elements!(self, v => v.iter().map(|x| x.to_i64()).collect()))
    }

    /// Element `i` as `f64` (`None` past the end).
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        each_elements!(self, v => v.get(i).map(|x| x.to_f64()))
    }

    /// The elements converted to `dtype` (PyTorch's `.to(dtype)`; see [`Element::from_f64`]).
    pub fn cast(&self, dtype: DType) -> Elements {
        fn to<S: Element>(v: &[S], dtype: DType) -> Elements {
            match dtype {
                DType::F64 => Elements::F64(convert(v)),
                DType::F32 => Elements::F32(convert(v)),
                DType::F16 => Elements::F16(convert(v)),
                DType::BF16 => Elements::BF16(convert(v)),
                DType::I64 => Elements::I64(convert(v)),
                DType::I32 => Elements::I32(convert(v)),
                DType::Bool => Elements::Bool(convert(v)),
            }
        }
        if dtype == self.dtype() {
            return self.clone();
        }
        each_elements!(self, v => to(v, dtype))
    }

    /// The little-endian bytes (on a little-endian machine, the memory itself for every
    /// dtype but `bool`, which is one byte 0 or 1 each).
    pub fn to_le_bytes(&self) -> Cow<'_, [u8]> {
        fn le<T: bytemuck::Pod>(v: &[T], to: impl Fn(&T) -> Vec<u8>) -> Cow<'_, [u8]> {
            if cfg!(target_endian = "little") {
                Cow::Borrowed(bytemuck::cast_slice(v))
            } else {
                Cow::Owned(v.iter().flat_map(to).collect())
            }
        }
        match self {
            Elements::F64(v) => le(v, |x| x.to_le_bytes().to_vec()),
            Elements::F32(v) => le(v, |x| x.to_le_bytes().to_vec()),
            Elements::F16(v) => le(v, |x| x.to_le_bytes().to_vec()),
            Elements::BF16(v) => le(v, |x| x.to_le_bytes().to_vec()),
            Elements::I64(v) => le(v, |x| x.to_le_bytes().to_vec()),
            Elements::I32(v) => le(v, |x| x.to_le_bytes().to_vec()),
            Elements::Bool(v) => Cow::Owned(v.iter().map(|&b| u8::from(b)).collect()),
        }
    }

    /// Elements of `dtype` from their little-endian bytes.
    pub fn from_le_bytes(dtype: DType, b: &[u8]) -> Result<Elements, BytesError> {
        let size = dtype.size_bytes();
        if !b.len().is_multiple_of(size) {
            return Err(BytesError::Length { dtype, len: b.len(), size });
        }
        if cfg!(target_endian = "little") && dtype != DType::Bool {
            // One copy into aligned memory (the bytes may sit at any address).
            return Elements::from_le_runs(dtype, b.len(), [b]);
        }
        fn read<T: bytemuck::Pod>(b: &[u8], from: impl Fn(&[u8]) -> T) -> Vec<T> {
            b.chunks_exact(std::mem::size_of::<T>()).map(from).collect()
        }
        let array = |c: &[u8]| -> [u8; 8] {
            let mut a = [0u8; 8];
            a[..c.len()].copy_from_slice(c);
            a
        };
        Ok(match dtype {
            DType::F64 => Elements::F64(read(b, |c| f64::from_le_bytes(array(c)))),
            DType::F32 => Elements::F32(read(b, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            DType::F16 => Elements::F16(read(b, |c| f16::from_le_bytes([c[0], c[1]]))),
            DType::BF16 => Elements::BF16(read(b, |c| bf16::from_le_bytes([c[0], c[1]]))),
            DType::I64 => Elements::I64(read(b, |c| i64::from_le_bytes(array(c)))),
            DType::I32 => Elements::I32(read(b, |c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            DType::Bool => Elements::Bool(
                b.iter()
                    .enumerate()
                    .map(|(index, &byte)| match byte {
                        0 => Ok(false),
                        1 => Ok(true),
                        _ => Err(BytesError::Bool { index, byte }),
                    })
                    .collect::<Result<_, _>>()?,
            ),
        })
    }

    /// Elements of `dtype` from little-endian byte runs laid end to end (`len` bytes in all),
    /// copied once into aligned memory (the bytes may sit at any address): what a gather of
    /// pieces from many places needs, and [`Elements::from_le_bytes`] with one run.
    pub fn from_le_runs<'a>(
        dtype: DType,
        len: usize,
        runs: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Elements, BytesError> {
        let size = dtype.size_bytes();
        if !len.is_multiple_of(size) {
            return Err(BytesError::Length { dtype, len, size });
        }
        /// `n` elements whose bytes are the runs' laid end to end, copied straight into new
        /// memory (no pass of zeros first: a large read's cost is its copies) and made the
        /// variant `wrap` makes, and the runs' length in bytes; the elements are empty unless
        /// that is exactly `n` elements' bytes.
        #[allow(unsafe_code)]
        fn filled<T: bytemuck::Pod>(
            n: usize,
            runs: impl IntoIterator<Item = impl AsRef<[u8]>>,
            wrap: fn(Vec<T>) -> Elements,
        ) -> (Elements, usize) {
            let mut out: Vec<T> = Vec::with_capacity(n);
            let room = n * std::mem::size_of::<T>();
            let to = out.as_mut_ptr().cast::<u8>();
            let mut at = 0usize;
            for run in runs {
                let run = run.as_ref();
                let take = run.len().min(room.saturating_sub(at));
                // SAFETY: `at + take <= room`, the bytes `out` has room for; a run cannot
                // overlap memory just allocated.
                unsafe { std::ptr::copy_nonoverlapping(run.as_ptr(), to.add(at), take) };
                at += run.len();
            }
            if at == room {
                // SAFETY: the runs wrote all `room` bytes, and any bytes are a valid `T` (`Pod`).
                unsafe { out.set_len(n) };
            }
            (wrap(out), at)
        }
        if cfg!(target_endian = "big") || dtype == DType::Bool {
            let bytes: Vec<u8> = runs.into_iter().flatten().copied().collect();
            if bytes.len() != len {
                return Err(BytesError::Length { dtype, len: bytes.len(), size });
            }
            return Elements::from_le_bytes(dtype, &bytes);
        }
        let n = len / size;
        let (out, got) = match dtype {
            DType::F64 => filled(n, runs, Elements::F64),
            DType::F32 => filled(n, runs, Elements::F32),
            DType::F16 => filled(n, runs, Elements::F16),
            DType::BF16 => filled(n, runs, Elements::BF16),
            DType::I64 => filled(n, runs, Elements::I64),
            DType::I32 => filled(n, runs, Elements::I32),
            DType::Bool => unreachable!("bools took the byte-checking path above"),
        };
        if got != len {
            return Err(BytesError::Length { dtype, len: got, size });
        }
        Ok(out)
    }

    /// Element `i` printed as `print` shows it (`None` past the end).
    pub fn format_element(&self, i: usize) -> Option<String> {
        Some(match self {
            Elements::F64(v) => format_f64(*v.get(i)?),
            Elements::F32(v) => format_element(*v.get(i)?),
            Elements::F16(v) => format_element(v.get(i)?.to_f32()),
            Elements::BF16(v) => format_element(v.get(i)?.to_f32()),
            Elements::I64(v) => v.get(i)?.to_string(),
            Elements::I32(v) => v.get(i)?.to_string(),
            Elements::Bool(v) => v.get(i)?.to_string(),
        })
    }
}

macro_rules! elements_from {
    ($($t:ty => $d:ident),*) => {$(
        impl From<Vec<$t>> for Elements {
            fn from(v: Vec<$t>) -> Elements {
                Elements::$d(v)
            }
        }
    )*};
}
elements_from!(f64 => F64, f32 => F32, f16 => F16, bf16 => BF16, i64 => I64, i32 => I32, bool => Bool);

impl Serialize for Elements {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&self.dtype())?;
        t.serialize_element(serde_bytes_ref(&self.to_le_bytes()))?;
        t.end()
    }
}

/// `bytes` serialized as one byte string.
fn serde_bytes_ref(bytes: &[u8]) -> &Bytes {
    Bytes::new(bytes)
}

/// A byte slice that serializes as a byte string (`serialize_bytes`).
#[repr(transparent)]
struct Bytes([u8]);

impl Bytes {
    #[allow(unsafe_code)]
    fn new(b: &[u8]) -> &Bytes {
        // SAFETY: `Bytes` is a `repr(transparent)` wrapper of `[u8]`.
        unsafe { &*(b as *const [u8] as *const Bytes) }
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Elements {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Elements, D::Error> {
        struct Pair;
        impl<'de> Visitor<'de> for Pair {
            type Value = Elements;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a dtype and little-endian element bytes")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Elements, A::Error> {
                let dtype: DType = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                seq.next_element_seed(LeElements(dtype))?.ok_or_else(|| de::Error::invalid_length(1, &self))
            }
        }
        d.deserialize_tuple(2, Pair)
    }
}

/// The elements of a `dtype` read from one byte string (a msgpack `bin`), converted straight
/// from the decoder's bytes: one copy, where an owned byte buffer first would make two.
struct LeElements(DType);

impl<'de> de::DeserializeSeed<'de> for LeElements {
    type Value = Elements;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Elements, D::Error> {
        d.deserialize_bytes(self)
    }
}

impl Visitor<'_> for LeElements {
    type Value = Elements;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the little-endian bytes of {} elements", self.0)
    }
    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Elements, E> {
        Elements::from_le_bytes(self.0, b).map_err(E::custom)
    }
}

/// Above this many elements, printing shows the first and last [`EDGE_ITEMS`] of each axis.
pub const SUMMARY_THRESHOLD: usize = 1000;
/// Items shown at each end of a summarised axis.
pub const EDGE_ITEMS: usize = 3;

/// Formats one element: 4 decimals at most, trailing zeros trimmed, `-0` as `0`.
pub fn format_element(x: f32) -> String {
    format_real(x)
}

/// Formats one `f64` element as [`format_element`] does an `f32`.
pub fn format_f64(x: f64) -> String {
    format_real(x)
}

/// Scientific notation below 1e-4 and from 1e16 on (thresholds in the element's own type).
fn format_real<T: num_traits::Float + fmt::Display + fmt::LowerExp>(x: T) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > T::zero() { "inf".into() } else { "-inf".into() };
    }
    let ax = x.abs();
    let (lo, hi) = (T::from(1e-4).unwrap_or_else(T::zero), T::from(1e16).unwrap_or_else(T::infinity));
    let s = if ax != T::zero() && !(ax >= lo && ax < hi) { format!("{x:.4e}") } else { format!("{x:.4}") };
    finish(trim_zeros(&s))
}

fn finish(s: String) -> String {
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

fn trim_zeros(s: &str) -> String {
    let (mantissa, exp) = match s.find('e') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let m = if mantissa.contains('.') { mantissa.trim_end_matches('0').trim_end_matches('.') } else { mantissa };
    format!("{m}{exp}")
}

impl HostTensor {
    /// A tensor from its type and data (the caller keeps `data.len() == numel` and the
    /// dtypes equal).
    pub fn new(ty: TensorType, data: impl Into<Elements>) -> HostTensor {
        HostTensor { ty, data: data.into() }
    }

    /// The data as `f32`s (converted when of another dtype).
    pub fn to_f32(&self) -> Vec<f32> {
        self.data.to_f32()
    }

    /// The values as nested brackets, NumPy style, summarised when large.
    pub fn format_values(&self) -> String {
        let dims = self.ty.shape.dims();
        // An empty tensor prints as `[]` (its type says the shape): nesting brackets for each
        // row of an `f32[1073741824, 0]` would print a billion of them.
        if self.ty.shape.numel() == 0 {
            return "[]".into();
        }
        let summarise = self.data.len() > SUMMARY_THRESHOLD;
        let mut out = String::new();
        self.format_axis(&mut out, dims, 0, summarise);
        out
    }

    fn format_axis(&self, out: &mut String, dims: &[usize], offset: usize, summarise: bool) {
        if dims.is_empty() {
            out.push_str(&self.data.format_element(offset).unwrap_or_else(|| "nan".into()));
            return;
        }
        let n = dims[0];
        let stride: usize = dims[1..].iter().product();
        out.push('[');
        let mut first = true;
        let mut push_item = |out: &mut String, i: usize| {
            if !first {
                out.push_str(", ");
            }
            first = false;
            self.format_axis(out, &dims[1..], offset + i * stride, summarise);
        };
        if summarise && n > 2 * EDGE_ITEMS {
            for i in 0..EDGE_ITEMS {
                push_item(out, i);
            }
            out.push_str(", ...");
            for i in n - EDGE_ITEMS..n {
                push_item(out, i);
            }
        } else {
            for i in 0..n {
                push_item(out, i);
            }
        }
        out.push(']');
    }
}

impl fmt::Display for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.ty, self.format_values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printing is bounded by what it prints: an empty tensor with a billion rows is `[]`
    /// (it took 31 s and 4.2 GB as a billion `[]`s).
    #[test]
    fn an_empty_tensor_prints_at_once_whatever_its_dims() {
        let t = HostTensor::new(TensorType::f32(vec![1 << 30, 0]), Vec::<f32>::new());
        assert_eq!(t.to_string(), "f32[1073741824, 0] []");
    }

    /// Runs laid end to end read as the bytes joined would, in every dtype; runs that miss
    /// the length, or split an element's bytes across runs, still give the same answer or an
    /// error, never a panic.
    #[test]
    fn runs_read_as_their_bytes_joined() {
        let all = [
            Elements::F64(vec![1.5, -2.0, 3.25]),
            Elements::F32(vec![1.5, -2.0, 3.25, 7.0]),
            Elements::F16(vec![f16::ONE, f16::MAX, f16::ZERO]),
            Elements::BF16(vec![bf16::ONE, bf16::MIN]),
            Elements::I64(vec![i64::MAX, -1]),
            Elements::I32(vec![i32::MIN, 5, 6]),
            Elements::Bool(vec![true, false, true]),
        ];
        for e in all {
            let bytes = e.to_le_bytes().into_owned();
            for cut in 0..=bytes.len() {
                let (a, b) = bytes.split_at(cut);
                assert_eq!(Elements::from_le_runs(e.dtype(), bytes.len(), [a, b]).unwrap(), e, "{e:?} cut {cut}");
            }
            assert!(Elements::from_le_runs(e.dtype(), bytes.len() + 1, [&bytes[..]]).is_err());
            assert!(Elements::from_le_runs(e.dtype(), bytes.len(), [&bytes[..], &bytes[..1]]).is_err());
            if bytes.len() > e.dtype().size_bytes() {
                let short = bytes.len() - e.dtype().size_bytes();
                assert!(Elements::from_le_runs(e.dtype(), bytes.len(), [&bytes[..short]]).is_err());
            }
        }
        assert!(Elements::from_le_runs(DType::Bool, 1, [&[2u8][..]]).is_err());
    }
}
