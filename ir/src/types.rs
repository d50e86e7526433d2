//! Element types, shapes and tensor types, with their text forms (`f32`, `[2, 3]`, `f32[2, 3]`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
///
/// Every dtype executes on the CPU interpreter; `fused` kernels (the JIT, the PTX generator)
/// and the CUDA backend take `f32` only, so the passes fuse `f32` work and the CUDA backend
/// refuses the rest by name. Arithmetic follows PyTorch's type promotion
/// ([`DType::promote`], `docs/dtypes.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// IEEE-754 binary32.
    F32,
    /// IEEE-754 binary16.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer.
    I32,
    /// Boolean.
    Bool,
    /// IEEE-754 binary64.
    F64,
    /// 64-bit signed integer.
    I64,
}

/// The kind of a dtype, in PyTorch's promotion order: a category higher than the other
/// operand's wins whatever the sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    /// `bool`
    Bool,
    /// `i32`, `i64`
    Integer,
    /// `f16`, `bf16`, `f32`, `f64`
    Float,
}

impl DType {
    /// Every dtype, in text-table order.
    pub const ALL: [DType; 7] = [DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::Bool];

    /// The dtype a float result takes when no operand is a float (`exp` of an integer,
    /// integer `/`), as PyTorch's default dtype.
    pub const DEFAULT_FLOAT: DType = DType::F32;

    /// The text form.
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    /// Parses the text form.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
        }
    }

    /// Its promotion category.
    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I32 | DType::I64 => Category::Integer,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Category::Float,
        }
    }

    /// A floating-point dtype.
    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    /// `f16` or `bf16`: stored in 16 bits, computed in `f32` (reductions accumulate there).
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// A signed integer dtype.
    pub fn is_integer(self) -> bool {
        self.category() == Category::Integer
    }

    /// The dtype of an arithmetic result over tensors of dtypes `a` and `b` (PyTorch's
    /// `promote_types`): the higher category wins; within one, the wider type; `f16` with
    /// `bf16` gives `f32`, since neither holds the other.
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a.category(), b.category()) {
            (x, y) if x > y => a,
            (x, y) if x < y => b,
            _ => match (a, b) {
                (F64, _) | (_, F64) => F64,
                (F32, _) | (_, F32) => F32,
                (F16, BF16) | (BF16, F16) => F32,
                (I64, _) | (_, I64) => I64,
                _ => a,
            },
        }
    }

    /// The dtype of `tensor op scalar` for a tensor of dtype `self` and a scalar operand
    /// `x`: a scalar never widens a tensor within its category, and raises it only to the
    /// scalar's category's default (`i32_tensor * 2` stays `i32`, `i32_tensor * 0.5` is
    /// `f32`, `bool_tensor + 1` is `i64`). Scalars are written without a type, so an
    /// integral value counts as an integer.
    pub fn promote_scalar(self, x: f64) -> DType {
        let category = if x.fract() == 0.0 && x.is_finite() { Category::Integer } else { Category::Float };
        if category <= self.category() {
            return self;
        }
        match category {
            Category::Float => DType::DEFAULT_FLOAT,
            _ => DType::I64,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A shape's dimensions: inline up to rank 4, so types of most tensors are built and cloned
/// without allocating (the type checks on every instruction's path do both).
pub type Dims = smallvec::SmallVec<[usize; 4]>;

/// Dimensions of a tensor, outermost first. A 0-d tensor (scalar) has no dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Shape(pub Dims);

impl Shape {
    /// A shape from dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(Dims::from_vec(dims.into()))
    }

    /// The 0-d shape.
    pub fn scalar() -> Shape {
        Shape(Dims::new())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of elements, or `None` when it overflows `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Number of elements. Shapes that reach the verifier's callers never overflow.
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Shape {
        Shape(Dims::from_vec(dims))
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Shape {
        Shape(Dims::from_slice(dims))
    }
}

/// The type of a tensor value: element type and shape. Text form `f32[2, 3]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType { dtype, shape: shape.into() }
    }

    /// An `f32` tensor type.
    pub fn f32(dims: impl Into<Vec<usize>>) -> TensorType {
        TensorType { dtype: DType::F32, shape: Shape::new(dims) }
    }

    /// Number of bytes the tensor occupies, saturating.
    pub fn size_bytes(&self) -> usize {
        self.shape.numel().saturating_mul(self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The promotion table users read (`docs/dtypes.md`) is the one the type rules apply:
    /// every cell, and the table is symmetric.
    #[test]
    fn promotion_is_the_documented_table() {
        let doc = include_str!("../../docs/dtypes.md");
        let header: Vec<DType> = doc
            .lines()
            .find(|l| l.starts_with("| | bool"))
            .expect("the table's header")
            .split('|')
            .filter_map(|c| DType::from_name(c.trim()))
            .collect();
        assert_eq!(header.len(), 7);
        let mut rows = 0;
        for line in doc.lines().filter(|l| l.starts_with("| **")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
            let row = DType::from_name(cells[0].trim_matches('*')).expect("a dtype row");
            for (col, cell) in header.iter().zip(&cells[1..]) {
                let want = DType::from_name(cell).expect("a dtype cell");
                assert_eq!(DType::promote(row, *col), want, "{row} with {col}");
                assert_eq!(DType::promote(*col, row), want, "{col} with {row}");
            }
            rows += 1;
        }
        assert_eq!(rows, 7);
    }

    #[test]
    fn scalars_raise_a_tensor_only_to_their_category() {
        assert_eq!(DType::I32.promote_scalar(2.0), DType::I32);
        assert_eq!(DType::I32.promote_scalar(0.5), DType::F32);
        assert_eq!(DType::Bool.promote_scalar(1.0), DType::I64);
        assert_eq!(DType::Bool.promote_scalar(0.5), DType::F32);
        assert_eq!(DType::F16.promote_scalar(1e6), DType::F16);
        assert_eq!(DType::I64.promote_scalar(f64::INFINITY), DType::F32);
        assert_eq!(DType::F64.promote_scalar(0.1), DType::F64);
    }
}
