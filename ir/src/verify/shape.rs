//! Type rules: the result types of every instruction from its operand types, plus the
//! shape helpers (broadcasting, axes, reshape, slicing, splitting) that backends reuse so
//! that execution and verification can never disagree.

use crate::ops::Domain;
use crate::{CollectiveOp, DType, Instr, Operand, Shape, SliceItem, SplitSpec, TensorType, ValueId};
use thiserror::Error;

/// The most elements one tensor may have (2^40); beyond this a shape is a mistake.
pub const MAX_ELEMENTS: usize = 1 << 40;

/// The most work one instruction or kernel may do: iterations of its innermost operation
/// (a matmul's multiply-adds, a kernel's loop trips, a 0 extent counted as 1), 2^42 (a
/// 16384^3 matmul). Beyond it a stream is a mistake or an attack on the worker's time.
pub const MAX_WORK: u128 = 1 << 42;

/// The most dimensions one tensor may have (NumPy's limit): every walk over a shape is then
/// short, whatever a peer sends.
pub const MAX_RANK: usize = 64;

/// Why an instruction's operands do not fit it. Messages say what was expected and found.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TypeError {
    /// A `fused` kernel buffer whose dtype does not load into what the kernel computes in
    /// (`f32` kernels take `f32`, `f16` and `bf16`; `f64` kernels `f64`; `i64` kernels the
    /// integers and `bool`; matmuls compute in `f32`).
    #[error("a `fused` kernel computing in {compute} takes {takes} only, found {dtype}")]
    KernelDType {
        /// The dtype.
        dtype: DType,
        /// What the kernel computes in.
        compute: crate::kernel::Compute,
        /// The dtypes it takes, as text.
        takes: &'static str,
    },
    /// A `where` whose condition is not `bool`.
    #[error("`where` takes a bool condition, found {found} (compare it first, e.g. `ne %c, 0`)")]
    WhereCondition {
        /// The condition's dtype.
        found: DType,
    },
    /// A `full` value that its dtype cannot hold (a fraction as an integer, a finite value
    /// beyond a float dtype's range).
    #[error("`full` value {value:?} is not a {dtype} element")]
    FullValue {
        /// The value.
        value: f64,
        /// The dtype.
        dtype: DType,
    },
    /// Literal data of another dtype than the literal's type (only from the wire).
    #[error("literal data of dtype {found} for a {expected} tensor")]
    LiteralDType {
        /// The literal's dtype.
        expected: DType,
        /// The data's.
        found: DType,
    },
    /// An op that does not take this dtype (`exp` of integers).
    #[error("`{op}` does not take dtype {dtype}")]
    OpDType {
        /// The op's mnemonic.
        op: &'static str,
        /// The operand's dtype.
        dtype: DType,
    },
    /// Operands of different dtypes.
    #[error("dtype mismatch: expected {expected}, found {found}")]
    DTypeMismatch {
        /// The first operand's dtype.
        expected: DType,
        /// The other's.
        found: DType,
    },
    /// A read of a value with no known type (the verifier reports undefined names itself).
    #[error("value {0} is not defined")]
    UnknownValue(ValueId),
    /// Shapes that do not broadcast.
    #[error("cannot broadcast {lhs} with {rhs}: dimension {lhs_dim} does not match {rhs_dim} (aligned from the right, sizes must be equal or 1)")]
    Broadcast {
        /// Left shape.
        lhs: Box<Shape>,
        /// Right shape.
        rhs: Box<Shape>,
        /// Offending size on the left.
        lhs_dim: usize,
        /// Offending size on the right.
        rhs_dim: usize,
    },
    /// `broadcast_to` a shape the operand cannot stretch to.
    #[error("cannot broadcast {from} to {to}")]
    BroadcastTo {
        /// Operand shape.
        from: Box<Shape>,
        /// Target.
        to: Box<Shape>,
    },
    /// A 0-d matmul operand.
    #[error("operands must have rank >= 1, found {lhs} and {rhs}")]
    MatMulRank {
        /// Left shape.
        lhs: Box<Shape>,
        /// Right shape.
        rhs: Box<Shape>,
    },
    /// Inner dimensions that differ.
    #[error("inner dimensions differ: left {lhs} has {lhs_k} columns, right {rhs} has {rhs_k} rows")]
    MatMulInner {
        /// Left shape.
        lhs: Box<Shape>,
        /// Right shape.
        rhs: Box<Shape>,
        /// Left's last dimension.
        lhs_k: usize,
        /// Right's contracting dimension.
        rhs_k: usize,
    },
    /// An axis outside `-rank..rank`.
    #[error("axis {axis} is out of range for rank {rank} ({})", if *rank == 0 { "a 0-d tensor has no axes".to_string() } else { format!("expected {lo}..={hi}") })]
    AxisOutOfRange {
        /// The axis as written.
        axis: i64,
        /// The rank.
        rank: usize,
        /// Lowest valid axis.
        lo: i64,
        /// Highest valid axis.
        hi: i64,
    },
    /// The same axis twice.
    #[error("axis {axis} is given more than once")]
    DuplicateAxis {
        /// The normalised axis.
        axis: usize,
    },
    /// A reshape to a different element count.
    #[error("cannot reshape {from} ({from_numel} elements) to [{}] ({to_numel} elements)", joined(to))]
    ReshapeCount {
        /// Operand shape.
        from: Box<Shape>,
        /// Operand elements.
        from_numel: usize,
        /// Target as written.
        to: Vec<i64>,
        /// Target elements.
        to_numel: usize,
    },
    /// A reshape target with a bad entry.
    #[error("invalid reshape target [{}]: {reason}", joined(to))]
    ReshapeTarget {
        /// Target as written.
        to: Vec<i64>,
        /// What is wrong.
        reason: &'static str,
    },
    /// Not a permutation of the axes.
    #[error("permutation {perm:?} is not a permutation of 0..{rank}")]
    Permutation {
        /// As written.
        perm: Vec<i64>,
        /// The rank.
        rank: usize,
    },
    /// `squeeze` of an axis whose size is not 1.
    #[error("cannot squeeze axis {axis} of size {size} (only size-1 axes)")]
    SqueezeNonUnit {
        /// The axis.
        axis: usize,
        /// Its size.
        size: usize,
    },
    /// `concat` of nothing.
    #[error("needs at least one operand")]
    ConcatEmpty,
    /// `concat` operands that differ off the axis.
    #[error("operand {index} has type {found}, which does not match {expected} outside axis {axis}")]
    ConcatMismatch {
        /// Operand position.
        index: usize,
        /// First operand's type.
        expected: Box<TensorType>,
        /// This operand's type.
        found: Box<TensorType>,
        /// The concat axis.
        axis: usize,
    },
    /// More slice items than axes.
    #[error("{items} indexing items but the operand has rank {rank}")]
    SliceTooMany {
        /// Items that index an axis.
        items: usize,
        /// The rank.
        rank: usize,
    },
    /// A single index out of range.
    #[error("index {index} is out of range for axis {axis} of size {size}")]
    SliceIndex {
        /// The index as written.
        index: i64,
        /// The axis.
        axis: usize,
        /// Its size.
        size: usize,
    },
    /// A step of 0.
    #[error("step must not be 0")]
    SliceStep,
    /// More than one `...`.
    #[error("at most one `...` is allowed")]
    SliceEllipsis,
    /// Split piece sizes that do not fit the axis.
    #[error("split sizes {sizes:?} sum to {sum}, but axis {axis} has size {len}")]
    SplitSizes {
        /// As written.
        sizes: Vec<usize>,
        /// Their sum.
        sum: usize,
        /// The axis.
        axis: usize,
        /// Its size.
        len: usize,
    },
    /// A split size or chunk count of 0.
    #[error("split size and chunk count must be at least 1")]
    SplitZero,
    /// A collective with the wrong number of operands or results.
    #[error("takes {expected} and names {results}; found {srcs} operands and {dsts} results")]
    CollectiveArity {
        /// What it takes.
        expected: &'static str,
        /// What results it names.
        results: &'static str,
        /// Operands given.
        srcs: usize,
        /// Results named.
        dsts: usize,
    },
    /// Collective operands that must have one type and do not.
    #[error("operand {index} has type {found}, but operand 0 has type {expected} (every participant contributes the same type)")]
    CollectiveMismatch {
        /// Operand position.
        index: usize,
        /// Operand 0's type.
        expected: Box<TensorType>,
        /// This operand's type.
        found: Box<TensorType>,
    },
    /// A split with a different number of results than pieces.
    #[error("split gives {pieces} pieces here, but {results} results are named")]
    SplitResults {
        /// Pieces the split produces.
        pieces: usize,
        /// Results named.
        results: usize,
    },
    /// Literal data of the wrong length.
    #[error("type {ty} needs {expected} values, found {found}")]
    LiteralCount {
        /// The type.
        ty: TensorType,
        /// `numel`.
        expected: usize,
        /// Values given.
        found: usize,
    },
    /// A `fused` kernel that does not fit its operands or result.
    #[error("the kernel does not fit: {source}")]
    Kernel {
        /// What does not fit.
        #[from]
        source: crate::kernel::KernelError,
    },
    /// A bad `arange`.
    #[error("{reason}")]
    Arange {
        /// What is wrong.
        reason: &'static str,
    },
    /// A shape with too many dimensions.
    #[error("rank {rank} is over the limit of {MAX_RANK} dimensions")]
    RankTooLarge {
        /// The rank.
        rank: usize,
    },
    /// An instruction or kernel that would do too much work (see [`MAX_WORK`]).
    #[error("{what} would do {work} iterations, over the limit of 2^42")]
    TooMuchWork {
        /// What (`matmul`, `the kernel`).
        what: &'static str,
        /// Its iterations.
        work: u128,
    },
    /// A shape with too many elements.
    #[error("shape {shape} is too large: its dimensions (a 0 counted as 1) multiply past 2^40")]
    TooLarge {
        /// The shape.
        shape: Shape,
    },
    /// A reshape target whose dimensions multiply past `usize` (see [`TypeError::TooLarge`]).
    #[error("shape [{}] is too large: its dimensions (a 0 counted as 1) multiply past 2^40", joined(to))]
    ReshapeTooLarge {
        /// Target as written.
        to: Vec<i64>,
    },
    /// A reduction that has no identity over an empty axis.
    #[error("an empty axis has no {op}imum")]
    EmptyReduction {
        /// The op.
        op: &'static str,
    },
}

impl TypeError {
    /// The failure kind: [`FailureKind::Limit`] for the bounds on rank, work and size, else
    /// [`FailureKind::Type`] (an undefined operand is [`FailureKind::Undefined`]).
    pub fn kind(&self) -> crate::FailureKind {
        use crate::FailureKind;
        match self {
            TypeError::RankTooLarge { .. }
            | TypeError::TooMuchWork { .. }
            | TypeError::TooLarge { .. }
            | TypeError::ReshapeTooLarge { .. } => FailureKind::Limit,
            TypeError::UnknownValue(_) => FailureKind::Undefined,
            TypeError::Kernel { .. } => FailureKind::Kernel,
            _ => FailureKind::Type,
        }
    }
}

/// `a, b, c`: a reshape target as written.
fn joined(dims: &[i64]) -> String {
    dims.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
}

/// Checks a `fused` kernel's operand or result dtype against what the kernel computes in:
/// each buffer's elements load into it as the interpreter converts them
/// ([`crate::kernel::Compute::of`]); a `bool` belongs to every kernel (a mask loads as 0 or
/// 1, a comparison's result stores nonzero as true).
pub fn check_kernel_dtype(dtype: DType, compute: crate::kernel::Compute) -> Result<(), TypeError> {
    if dtype == DType::Bool || crate::kernel::Compute::of(dtype) == compute {
        Ok(())
    } else {
        Err(TypeError::kernel_dtype(dtype, compute))
    }
}

/// Checks that an `i64` map kernel computes only what integers have: no float-only op
/// (`exp`, `/`...), no `mean` (which the type rules refuse integers, as PyTorch does).
fn check_kernel_ops(k: &crate::kernel::MapKernel) -> Result<(), TypeError> {
    use crate::kernel::{Compute, Node};
    if k.compute != Compute::I64 {
        return Ok(());
    }
    let dtype = DType::I64;
    let refused = |op: &'static str| Err(TypeError::OpDType { op, dtype });
    if k.reduce == Some(crate::ReduceOp::Mean) {
        return refused(crate::ReduceOp::Mean.mnemonic());
    }
    for node in &k.nodes {
        match *node {
            Node::Unary(op, _) if op.row().domain.compute(dtype) != Some(dtype) => return refused(op.mnemonic()),
            Node::Binary(op, ..) if !op.is_comparison() && op.row().domain.compute(dtype) != Some(dtype) => {
                return refused(op.mnemonic())
            }
            Node::Reduce(crate::ReduceOp::Mean, _) => return refused(crate::ReduceOp::Mean.mnemonic()),
            _ => {}
        }
    }
    Ok(())
}

impl TypeError {
    /// [`TypeError::KernelDType`]: `dtype` in a kernel computing in `compute`.
    pub fn kernel_dtype(dtype: DType, compute: crate::kernel::Compute) -> TypeError {
        use crate::kernel::Compute;
        let takes = match compute {
            Compute::F32 => "f32, f16 and bf16",
            Compute::F64 => "f64",
            Compute::I64 => "i64, i32 and bool",
        };
        TypeError::KernelDType { dtype, compute, takes }
    }
}

/// Checks a shape's element count is below [`MAX_ELEMENTS`], counting zero-sized
/// dimensions as 1 so that an empty tensor cannot carry absurd dimensions either.
pub fn check_size(shape: &Shape) -> Result<usize, TypeError> {
    let extent = shape.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)));
    match extent {
        Some(n) if n <= MAX_ELEMENTS => Ok(shape.numel()),
        _ => Err(TypeError::TooLarge { shape: shape.clone() }),
    }
}

/// The product of a shape's dimensions with a 0 counted as 1 (what loops over it iterate at
/// most), saturating.
pub fn extent(shape: &Shape) -> u128 {
    shape.0.iter().fold(1u128, |n, &d| n.saturating_mul(d.max(1) as u128))
}

/// The piece lengths of an axis of `len` cut into `n` pieces as `numpy.array_split` does:
/// the first `len % n` pieces one longer. `n` must be at least 1.
pub fn array_split(len: usize, n: usize) -> Vec<usize> {
    let n = n.max(1);
    (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
}

/// The type of `srcs` (the first of type `first`) joined along `axis`, as `concat` and
/// `all_gather` join them: every operand the same but along the axis.
fn joined_along(
    first: TensorType,
    srcs: &[ValueId],
    axis: i64,
    ty: &dyn Fn(ValueId) -> Result<TensorType, TypeError>,
) -> Result<TensorType, TypeError> {
    let a = normalize_axis(axis, first.shape.rank())?;
    let mut dims = first.shape.0.clone();
    for (index, &v) in srcs.iter().enumerate().skip(1) {
        let t = ty(v)?;
        let fits = t.dtype == first.dtype
            && t.shape.rank() == first.shape.rank()
            && (0..dims.len()).all(|i| i == a || t.shape.0[i] == first.shape.0[i]);
        if !fits {
            return Err(TypeError::ConcatMismatch {
                index,
                expected: Box::new(first.clone()),
                found: Box::new(t),
                axis: a,
            });
        }
        dims[a] = dims[a].saturating_add(t.shape.0[a]);
    }
    let shape = Shape(dims);
    check_size(&shape)?;
    Ok(TensorType { dtype: first.dtype, shape })
}

/// The result types of a collective over operands `srcs` naming `dsts` results.
fn collective(
    op: CollectiveOp,
    dsts: usize,
    srcs: &[ValueId],
    ty: &dyn Fn(ValueId) -> Result<TensorType, TypeError>,
) -> Result<ResultTypes, TypeError> {
    let (expected, results, fits) = match op {
        CollectiveOp::Broadcast => ("one operand", "one result per participant", srcs.len() == 1 && dsts >= 1),
        CollectiveOp::Move => ("one operand", "one result", srcs.len() == 1 && dsts == 1),
        _ => ("one operand per participant", "one result per participant", !srcs.is_empty() && dsts == srcs.len()),
    };
    if !fits {
        return Err(TypeError::CollectiveArity { expected, results, srcs: srcs.len(), dsts });
    }
    let first = ty(srcs[0])?;
    if let CollectiveOp::AllReduce(reduce) | CollectiveOp::ReduceScatter { op: reduce, .. } = op {
        reduce_dtype(reduce, op.mnemonic(), first.dtype)?;
    }
    let same = |index: usize, t: TensorType| {
        if t == first {
            Ok(())
        } else {
            Err(TypeError::CollectiveMismatch { index, expected: Box::new(first.clone()), found: Box::new(t) })
        }
    };
    match op {
        CollectiveOp::Broadcast | CollectiveOp::Move => Ok((vec![first.clone(); dsts]).into()),
        CollectiveOp::AllReduce(_) => {
            for (index, &v) in srcs.iter().enumerate().skip(1) {
                same(index, ty(v)?)?;
            }
            Ok((vec![first.clone(); dsts]).into())
        }
        CollectiveOp::ReduceScatter { axis, .. } => {
            for (index, &v) in srcs.iter().enumerate().skip(1) {
                same(index, ty(v)?)?;
            }
            let a = normalize_axis(axis, first.shape.rank())?;
            Ok(array_split(first.shape.0[a], dsts)
                .into_iter()
                .map(|n| {
                    let mut dims = first.shape.0.clone();
                    dims[a] = n;
                    TensorType { dtype: first.dtype, shape: Shape(dims) }
                })
                .collect())
        }
        CollectiveOp::AllGather { axis } => Ok((vec![joined_along(first, srcs, axis, ty)?; dsts]).into()),
    }
}

/// Turns a possibly negative axis into an index below `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize, TypeError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(TypeError::AxisOutOfRange { axis, rank, lo: -r, hi: r - 1 });
    }
    Ok(a as usize)
}

/// Normalises a list of axes, rejecting duplicates; the result is sorted.
pub fn normalize_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>, TypeError> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(a, rank)?;
        if out.contains(&n) {
            return Err(TypeError::DuplicateAxis { axis: n });
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, TypeError> {
    let rank = a.rank().max(b.rank());
    let mut dims = vec![0; rank];
    for (i, dim) in dims.iter_mut().enumerate() {
        let da = if i < rank - a.rank() { 1 } else { a.0[i - (rank - a.rank())] };
        let db = if i < rank - b.rank() { 1 } else { b.0[i - (rank - b.rank())] };
        *dim = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(TypeError::Broadcast {
                lhs: Box::new(a.clone()),
                rhs: Box::new(b.clone()),
                lhs_dim: da,
                rhs_dim: db,
            });
        };
    }
    Ok(Shape(dims.into()))
}

/// Resolves a reshape target (one `-1` allowed) against an element count.
pub fn resolve_reshape(from: &Shape, to: &[i64]) -> Result<Shape, TypeError> {
    let written = || to.to_vec();
    let mut infer = None;
    let mut known: usize = 1;
    for (i, &d) in to.iter().enumerate() {
        if d == -1 {
            if infer.is_some() {
                return Err(TypeError::ReshapeTarget { to: written(), reason: "at most one dimension may be -1" });
            }
            infer = Some(i);
        } else if d < 0 {
            return Err(TypeError::ReshapeTarget { to: written(), reason: "dimensions must be >= 0 or -1" });
        } else {
            known = known.checked_mul(d as usize).ok_or_else(|| TypeError::ReshapeTooLarge { to: written() })?;
        }
    }
    let numel = from.numel();
    let mut dims: Vec<usize> = to.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(TypeError::ReshapeTarget {
                to: written(),
                reason: "the -1 dimension cannot be inferred from the element count",
            });
        }
        dims[i] = numel / known;
        known *= dims[i];
    }
    if known != numel {
        return Err(TypeError::ReshapeCount {
            from: Box::new(from.clone()),
            from_numel: numel,
            to: written(),
            to_numel: known,
        });
    }
    Ok(Shape(dims.into()))
}

/// One input axis of a resolved slice: elements `start, start+step, ..` (`len` of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AxisSlice {
    /// First index.
    pub start: usize,
    /// Stride (never 0).
    pub step: i64,
    /// Number of elements taken.
    pub len: usize,
}

/// A slice resolved against a shape: what each input axis takes, and the result shape.
/// The result's row-major elements are the selected elements in input row-major order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSlice {
    /// One entry per input axis.
    pub axes: Vec<AxisSlice>,
    /// Per input axis, the result axis it becomes (`None`: indexed, dropped).
    pub kept: Vec<Option<usize>>,
    /// The result shape (indexed axes dropped, new axes inserted).
    pub shape: Shape,
}

/// Resolves a NumPy basic index against a shape.
pub fn resolve_slice(index: &[SliceItem], shape: &Shape) -> Result<ResolvedSlice, TypeError> {
    let ellipses = index.iter().filter(|i| matches!(i, SliceItem::Ellipsis)).count();
    if ellipses > 1 {
        return Err(TypeError::SliceEllipsis);
    }
    let consuming = index.iter().filter(|i| matches!(i, SliceItem::Range { .. } | SliceItem::Index(_))).count();
    if consuming > shape.rank() {
        return Err(TypeError::SliceTooMany { items: consuming, rank: shape.rank() });
    }
    let full = SliceItem::Range { start: None, end: None, step: 1 };
    let mut items = Vec::with_capacity(shape.rank() + index.len());
    for item in index {
        if let SliceItem::Ellipsis = item {
            items.extend(std::iter::repeat_n(full, shape.rank() - consuming));
        } else {
            items.push(*item);
        }
    }
    if ellipses == 0 {
        items.extend(std::iter::repeat_n(full, shape.rank() - consuming));
    }
    let mut axes = Vec::with_capacity(shape.rank());
    let mut kept = Vec::with_capacity(shape.rank());
    let mut out = Vec::new();
    let mut axis = 0;
    for item in items {
        match item {
            SliceItem::NewAxis => out.push(1),
            SliceItem::Index(i) => {
                let n = shape.0[axis];
                let j = if i < 0 { i + n as i64 } else { i };
                if j < 0 || j >= n as i64 {
                    return Err(TypeError::SliceIndex { index: i, axis, size: n });
                }
                axes.push(AxisSlice { start: j as usize, step: 1, len: 1 });
                kept.push(None);
                axis += 1;
            }
            SliceItem::Range { start, end, step } => {
                // i128 arithmetic: no bound, step or dimension can overflow it.
                let n = shape.0[axis] as i128;
                if step == 0 {
                    return Err(TypeError::SliceStep);
                }
                let step = i128::from(step);
                let (first, len) = if step > 0 {
                    let clamp = |x: i64| (if x < 0 { i128::from(x) + n } else { i128::from(x) }).clamp(0, n);
                    let s = start.map_or(0, clamp);
                    let e = end.map_or(n, clamp);
                    (s, if e > s { (e - s + step - 1) / step } else { 0 })
                } else {
                    let clamp = |x: i64| (if x < 0 { i128::from(x) + n } else { i128::from(x) }).clamp(-1, n - 1);
                    let s = start.map_or(n - 1, clamp);
                    let e = end.map_or(-1, clamp);
                    (s, if s > e { (s - e - step - 1) / (-step) } else { 0 })
                };
                // |step| beyond the axis takes at most one element; clamp so it fits i64.
                let step = step.clamp(-(1 << 62), 1 << 62) as i64;
                axes.push(AxisSlice { start: if len == 0 { 0 } else { first as usize }, step, len: len as usize });
                kept.push(Some(out.len()));
                out.push(len as usize);
                axis += 1;
            }
            SliceItem::Ellipsis => unreachable!("expanded above"),
        }
    }
    Ok(ResolvedSlice { axes, kept, shape: Shape(out.into()) })
}

/// How many pieces a split of an axis of length `len` gives (without building them).
/// As in torch, an empty axis gives one empty piece for `split` and `chunks` empty pieces
/// for `chunk`.
pub fn split_count(spec: &SplitSpec, len: usize) -> Result<usize, TypeError> {
    match spec {
        SplitSpec::Size(0) | SplitSpec::Chunks(0) => Err(TypeError::SplitZero),
        SplitSpec::Chunks(c) if len == 0 => Ok(*c),
        SplitSpec::Size(n) => Ok(len.div_ceil(*n).max(1)),
        SplitSpec::Chunks(c) => Ok(len.div_ceil(len.div_ceil(*c).max(1)).max(1)),
        SplitSpec::Sizes(sizes) => Ok(sizes.len()),
    }
}

/// The piece sizes of a split along an axis of length `len`. Call [`split_count`] first
/// when the count is bounded elsewhere: this builds one entry per piece.
pub fn split_sizes(spec: &SplitSpec, len: usize, axis: usize) -> Result<Vec<usize>, TypeError> {
    match spec {
        SplitSpec::Size(0) | SplitSpec::Chunks(0) => Err(TypeError::SplitZero),
        SplitSpec::Chunks(c) if len == 0 => Ok(vec![0; *c]),
        SplitSpec::Size(_) if len == 0 => Ok(vec![0]),
        SplitSpec::Size(n) => {
            let mut out = vec![*n; len / n];
            if !len.is_multiple_of(*n) {
                out.push(len % n);
            }
            Ok(out)
        }
        SplitSpec::Chunks(c) => {
            let size = len.div_ceil(*c).max(1);
            split_sizes(&SplitSpec::Size(size), len, axis)
        }
        SplitSpec::Sizes(sizes) => {
            let sum = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)).unwrap_or(usize::MAX);
            if sum != len {
                return Err(TypeError::SplitSizes { sizes: sizes.clone(), sum, axis, len });
            }
            Ok(sizes.clone())
        }
    }
}

/// Length of `arange start end step`.
pub fn arange_len(start: f64, end: f64, step: f64) -> Result<usize, TypeError> {
    if !(start.is_finite() && end.is_finite() && step.is_finite()) {
        return Err(TypeError::Arange { reason: "start, end and step must be finite" });
    }
    if step == 0.0 {
        return Err(TypeError::Arange { reason: "step must not be 0" });
    }
    let n = ((end - start) / step).ceil();
    if n > MAX_ELEMENTS as f64 {
        return Err(TypeError::Arange { reason: "more than 2^40 elements" });
    }
    Ok(if n > 0.0 { n as usize } else { 0 })
}

/// The result type of a matmul (NumPy `matmul` rules).
pub fn matmul_type(lhs: &TensorType, rhs: &TensorType) -> Result<TensorType, TypeError> {
    let (a, b) = (&lhs.shape, &rhs.shape);
    if a.rank() == 0 || b.rank() == 0 {
        return Err(TypeError::MatMulRank { lhs: Box::new(a.clone()), rhs: Box::new(b.clone()) });
    }
    let dtype = Domain::Numeric
        .compute(DType::promote(lhs.dtype, rhs.dtype))
        .ok_or(TypeError::OpDType { op: "matmul", dtype: DType::Bool })?;
    let a2 = if a.rank() == 1 { Shape(smallvec::smallvec![1, a.0[0]]) } else { a.clone() };
    let b2 = if b.rank() == 1 { Shape(smallvec::smallvec![b.0[0], 1]) } else { b.clone() };
    let (m, ka) = (a2.0[a2.rank() - 2], a2.0[a2.rank() - 1]);
    let (kb, n) = (b2.0[b2.rank() - 2], b2.0[b2.rank() - 1]);
    if ka != kb {
        return Err(TypeError::MatMulInner {
            lhs: Box::new(a.clone()),
            rhs: Box::new(b.clone()),
            lhs_k: ka,
            rhs_k: kb,
        });
    }
    let batch = broadcast_shapes(&Shape::from(&a2.0[..a2.rank() - 2]), &Shape::from(&b2.0[..b2.rank() - 2]))?;
    let mut dims = batch.0;
    if a.rank() > 1 {
        dims.push(m);
    }
    if b.rank() > 1 {
        dims.push(n);
    }
    let shape = Shape(dims);
    check_size(&shape)?;
    Ok(TensorType { dtype, shape })
}

/// The broadcast shape and promoted dtype of elementwise operands (PyTorch's promotion:
/// tensors by [`DType::promote`], then scalars by [`DType::promote_scalar`]; scalars alone
/// are `f32`).
pub fn elementwise(
    operands: &[Operand],
    ty: &dyn Fn(ValueId) -> Result<TensorType, TypeError>,
) -> Result<TensorType, TypeError> {
    // PyTorch's priorities: tensors with dims decide the dtype; a 0-d tensor takes part only
    // where its category (bool < integer < float) is higher, as a scalar does
    // (`f16[n] + f32[]` is `f16`, `i32[n] + f64[]` is `f64`).
    let category = |d: DType| u8::from(d != DType::Bool) + u8::from(d.is_float());
    let (mut out, mut dimmed, mut zero_dim): (Option<TensorType>, Option<DType>, Option<DType>) = (None, None, None);
    for o in operands {
        if let Operand::Value(v) = o {
            let t = ty(*v)?;
            let class = if t.shape.rank() == 0 { &mut zero_dim } else { &mut dimmed };
            *class = Some(class.map_or(t.dtype, |d| DType::promote(d, t.dtype)));
            out = Some(match out {
                None => t,
                Some(acc) => TensorType { dtype: acc.dtype, shape: broadcast_shapes(&acc.shape, &t.shape)? },
            });
        }
    }
    let mut out = out.unwrap_or_else(|| TensorType::f32(vec![]));
    out.dtype = match (dimmed, zero_dim) {
        (Some(d), Some(z)) if category(z) > category(d) => DType::promote(d, z),
        (Some(d), _) => d,
        (None, Some(z)) => z,
        (None, None) => out.dtype,
    };
    for o in operands {
        if let Operand::Scalar(x) = o {
            out.dtype = out.dtype.promote_scalar(*x);
        }
    }
    check_size(&out.shape)?;
    Ok(out)
}

/// The dtype an elementwise op computes in, for operands promoted to `dtype` (the op
/// table's domain).
fn compute_dtype(op: &'static str, domain: Domain, dtype: DType) -> Result<DType, TypeError> {
    domain.compute(dtype).ok_or(TypeError::OpDType { op, dtype })
}

/// The dtype a binary op computes in and the dtype of its result (`bool` for comparisons,
/// which compare any two dtypes after promotion).
pub fn binary_dtypes(op: crate::BinaryOp, operands: DType) -> Result<(DType, DType), TypeError> {
    if op.is_comparison() {
        return Ok((operands, DType::Bool));
    }
    let compute = compute_dtype(op.mnemonic(), op.row().domain, operands)?;
    Ok((compute, compute))
}

/// The result dtype of a reduction over `dtype`: sums of integers and `bool`s are `i64`
/// (PyTorch), means need floats, `max`/`min` keep the dtype.
pub fn reduce_dtype(op: crate::ReduceOp, mnemonic: &'static str, dtype: DType) -> Result<DType, TypeError> {
    use crate::ReduceOp;
    match op {
        ReduceOp::Sum if !dtype.is_float() => Ok(DType::I64),
        ReduceOp::Mean if !dtype.is_float() => Err(TypeError::OpDType { op: mnemonic, dtype }),
        _ => Ok(dtype),
    }
}

fn created(ty: &TensorType) -> Result<ResultTypes, TypeError> {
    check_size(&ty.shape)?;
    Ok(smallvec::smallvec![ty.clone()])
}

/// Whether `dtype` holds `value` exactly (a `full` or literal value).
fn holds(dtype: DType, value: f64) -> bool {
    match dtype {
        DType::Bool => value == 0.0 || value == 1.0,
        DType::I32 => value.fract() == 0.0 && (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&value),
        // 2^63 itself is out of range; every float below it is an exact i64.
        DType::I64 => value.fract() == 0.0 && (-(2f64.powi(63))..2f64.powi(63)).contains(&value),
        DType::F16 => !value.is_finite() || crate::data::f16_of(value).is_finite(),
        DType::BF16 => !value.is_finite() || crate::data::bf16_of(value).is_finite(),
        // As PyTorch's `full`, a finite value the dtype overflows is refused.
        DType::F32 => !value.is_finite() || (value as f32).is_finite(),
        DType::F64 => true,
    }
}

/// An instruction's result types: inline for the one result of almost every instruction, so
/// typing one allocates nothing but its shapes beyond rank 4.
pub type ResultTypes = smallvec::SmallVec<[TensorType; 1]>;

/// The result types of an instruction, given the types of the values it reads.
///
/// `ty` answers the type of each operand value. Results come in [`Instr::results`] order.
pub fn infer(instr: &Instr, ty: &dyn Fn(ValueId) -> Result<TensorType, TypeError>) -> Result<ResultTypes, TypeError> {
    let results = infer_any_rank(instr, ty)?;
    match results.iter().find(|t| t.shape.rank() > MAX_RANK) {
        Some(t) => Err(TypeError::RankTooLarge { rank: t.shape.rank() }),
        None => Ok(results),
    }
}

/// [`infer`] without the rank limit.
fn infer_any_rank(
    instr: &Instr,
    ty: &dyn Fn(ValueId) -> Result<TensorType, TypeError>,
) -> Result<ResultTypes, TypeError> {
    let one = |t: TensorType| Ok(smallvec::smallvec![t]);
    match instr {
        Instr::Randn { ty: t, .. } | Instr::Rand { ty: t, .. } => {
            if !t.dtype.is_float() {
                return Err(TypeError::OpDType { op: instr.mnemonic(), dtype: t.dtype });
            }
            created(t)
        }
        Instr::Zeros { ty: t, .. } | Instr::Ones { ty: t, .. } => created(t),
        Instr::Full { ty: t, value, .. } => {
            if !holds(t.dtype, *value) {
                return Err(TypeError::FullValue { value: *value, dtype: t.dtype });
            }
            created(t)
        }
        Instr::Literal { ty: t, data, .. } => {
            if data.dtype() != t.dtype {
                return Err(TypeError::LiteralDType { expected: t.dtype, found: data.dtype() });
            }
            let out = created(t)?;
            let expected = t.shape.numel();
            if data.len() != expected {
                return Err(TypeError::LiteralCount { ty: t.clone(), expected, found: data.len() });
            }
            Ok(out)
        }
        Instr::Arange { dtype, start, end, step, .. } => {
            if *dtype == DType::Bool {
                return Err(TypeError::OpDType { op: "arange", dtype: *dtype });
            }
            one(TensorType::new(*dtype, vec![arange_len(*start, *end, *step)?]))
        }
        Instr::Unary { op, src, .. } => {
            let t = ty(*src)?;
            let dtype = compute_dtype(op.mnemonic(), op.row().domain, t.dtype)?;
            one(TensorType { dtype, ..t })
        }
        Instr::Cast { src, dtype, .. } => one(TensorType { dtype: *dtype, ..ty(*src)? }),
        Instr::Binary { op, lhs, rhs, .. } => {
            let t = elementwise(&[*lhs, *rhs], ty)?;
            let (_, dtype) = binary_dtypes(*op, t.dtype)?;
            one(TensorType { dtype, ..t })
        }
        Instr::Where { cond, on_true, on_false, .. } => {
            let c = ty(*cond)?;
            if c.dtype != DType::Bool {
                return Err(TypeError::WhereCondition { found: c.dtype });
            }
            let v = elementwise(&[*on_true, *on_false], ty)?;
            let shape = broadcast_shapes(&c.shape, &v.shape)?;
            check_size(&shape)?;
            one(TensorType { dtype: v.dtype, shape })
        }
        Instr::MatMul { lhs, rhs, .. } => {
            let (l, r) = (ty(*lhs)?, ty(*rhs)?);
            let out = matmul_type(&l, &r)?;
            // Every output element sums `k` products.
            let k = l.shape.0.last().copied().unwrap_or(1).max(1) as u128;
            let work = extent(&out.shape).saturating_mul(k);
            if work > MAX_WORK {
                return Err(TypeError::TooMuchWork { what: "matmul", work });
            }
            one(out)
        }
        Instr::Reduce { op, src, axes, keepdim, .. } => {
            let t = ty(*src)?;
            let dtype = reduce_dtype(*op, op.mnemonic(), t.dtype)?;
            let rank = t.shape.rank();
            let axes = match axes {
                Some(a) => normalize_axes(a, rank)?,
                None => (0..rank).collect(),
            };
            if matches!(op, crate::ReduceOp::Max | crate::ReduceOp::Min) && axes.iter().any(|&a| t.shape.0[a] == 0) {
                return Err(TypeError::EmptyReduction { op: op.mnemonic() });
            }
            let dims = (0..rank)
                .filter_map(|i| match (axes.contains(&i), keepdim) {
                    (true, true) => Some(1),
                    (true, false) => None,
                    (false, _) => Some(t.shape.0[i]),
                })
                .collect();
            one(TensorType { dtype, shape: Shape(dims) })
        }
        Instr::Transpose { src, dim0, dim1, .. } => {
            let t = ty(*src)?;
            let (a, b) = (normalize_axis(*dim0, t.shape.rank())?, normalize_axis(*dim1, t.shape.rank())?);
            let mut dims = t.shape.0.clone();
            dims.swap(a, b);
            one(TensorType { dtype: t.dtype, shape: Shape(dims) })
        }
        Instr::Permute { src, perm, .. } => {
            let t = ty(*src)?;
            let rank = t.shape.rank();
            let bad = || TypeError::Permutation { perm: perm.clone(), rank };
            if perm.len() != rank {
                return Err(bad());
            }
            let norm = normalize_axes(perm, rank).map_err(|_| bad())?;
            debug_assert_eq!(norm.len(), rank);
            let mut dims = Vec::with_capacity(rank);
            for &p in perm {
                dims.push(t.shape.0[normalize_axis(p, rank)?]);
            }
            one(TensorType { dtype: t.dtype, shape: Shape(dims.into()) })
        }
        Instr::Reshape { src, shape, .. } => {
            let t = ty(*src)?;
            one(TensorType { dtype: t.dtype, shape: resolve_reshape(&t.shape, shape)? })
        }
        Instr::Squeeze { src, axes, .. } => {
            let t = ty(*src)?;
            let dims = match axes {
                None => t.shape.0.iter().copied().filter(|&d| d != 1).collect(),
                Some(a) => {
                    let axes = normalize_axes(a, t.shape.rank())?;
                    for &a in &axes {
                        if t.shape.0[a] != 1 {
                            return Err(TypeError::SqueezeNonUnit { axis: a, size: t.shape.0[a] });
                        }
                    }
                    t.shape.0.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
                }
            };
            one(TensorType { dtype: t.dtype, shape: Shape(dims) })
        }
        Instr::Unsqueeze { src, axis, .. } => {
            let t = ty(*src)?;
            let a = normalize_axis(*axis, t.shape.rank() + 1)?;
            let mut dims = t.shape.0.clone();
            dims.insert(a, 1);
            one(TensorType { dtype: t.dtype, shape: Shape(dims) })
        }
        Instr::BroadcastTo { src, shape, .. } => {
            let t = ty(*src)?;
            let to = Shape::from(shape.as_slice());
            check_size(&to)?;
            match broadcast_shapes(&t.shape, &to) {
                Ok(s) if s == to => one(TensorType { dtype: t.dtype, shape: to }),
                _ => Err(TypeError::BroadcastTo { from: Box::new(t.shape), to: Box::new(to) }),
            }
        }
        Instr::Concat { srcs, axis, .. } => {
            let first = ty(*srcs.first().ok_or(TypeError::ConcatEmpty)?)?;
            one(joined_along(first, srcs, *axis, ty)?)
        }
        Instr::Slice { src, index, .. } => {
            let t = ty(*src)?;
            one(TensorType { dtype: t.dtype, shape: resolve_slice(index, &t.shape)?.shape })
        }
        Instr::Split { dsts, src, axis, spec } => {
            let t = ty(*src)?;
            let a = normalize_axis(*axis, t.shape.rank())?;
            let pieces = split_count(spec, t.shape.0[a])?;
            if pieces != dsts.len() {
                return Err(TypeError::SplitResults { pieces, results: dsts.len() });
            }
            let sizes = split_sizes(spec, t.shape.0[a], a)?;
            Ok(sizes
                .into_iter()
                .map(|n| {
                    let mut dims = t.shape.0.clone();
                    dims[a] = n;
                    TensorType { dtype: t.dtype, shape: Shape(dims) }
                })
                .collect())
        }
        Instr::Collective { dsts, op, srcs } => collective(*op, dsts.len(), srcs, ty),
        Instr::Free { src } | Instr::GetData { src } => {
            ty(*src)?;
            Ok(ResultTypes::new())
        }
        Instr::Fused { ty: t, srcs, kernel, .. } => {
            let compute = match &**kernel {
                crate::kernel::Kernel::Map(k) => k.compute,
                crate::kernel::Kernel::MatMul(_) => crate::kernel::Compute::F32,
            };
            check_kernel_dtype(t.dtype, compute)?;
            if let crate::kernel::Kernel::Map(k) = &**kernel {
                check_kernel_ops(k)?;
            }
            let out = created(t)?;
            let mut lens = Vec::with_capacity(srcs.len());
            for &src in srcs {
                let s = ty(src)?;
                check_kernel_dtype(s.dtype, compute)?;
                lens.push(s.shape.numel());
            }
            let fits = kernel.check_bounds(&lens, t.shape.numel()).and_then(|()| kernel.check_covers(t.shape.numel()));
            fits?;
            Ok(out)
        }
        Instr::HotPathStart { .. } | Instr::HotPathEnd { .. } | Instr::SignalStart { .. } | Instr::SignalEnd { .. } => {
            Ok(ResultTypes::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolved_slice_says_where_each_kept_axis_goes() {
        // `[new, 1, ..., 2:]` of [3, 4, 5]: axis 0 indexed away, axes 1 and 2 after the new one.
        let index = [
            SliceItem::NewAxis,
            SliceItem::Index(1),
            SliceItem::Ellipsis,
            SliceItem::Range { start: Some(2), end: None, step: 1 },
        ];
        let r = resolve_slice(&index, &Shape(vec![3, 4, 5].into())).unwrap();
        assert_eq!(r.kept, vec![None, Some(1), Some(2)]);
        assert_eq!(r.shape.0.to_vec(), vec![1, 4, 3]);
        assert_eq!(r.axes[1], AxisSlice { start: 0, step: 1, len: 4 });
    }
}
