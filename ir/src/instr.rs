//! `Instr`: the one enum of every operation a stream can carry, with operand and result
//! accessors. Semantics are in `lib.rs`; type rules in `verify/shape.rs`.

use crate::kernel::Kernel;
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::types::{DType, TensorType};
use crate::ValueId;
use serde::{Deserialize, Serialize};

/// An operand of an elementwise op: a value, or a scalar immediate of the other operand's
/// dtype (`mul %x, 0.5`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Operand {
    /// A tensor value.
    Value(ValueId),
    /// A scalar, broadcast like a 0-d tensor.
    Scalar(f64),
}

impl Operand {
    /// The value read, if this operand is one.
    pub fn value(self) -> Option<ValueId> {
        match self {
            Operand::Value(v) => Some(v),
            Operand::Scalar(_) => None,
        }
    }
}

/// One item of a slice index, NumPy style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SliceItem {
    /// `start:end:step` on one axis; missing bounds default by the sign of `step`
    /// (as in NumPy); negative bounds count from the end; bounds are clamped.
    Range {
        /// First index (inclusive).
        start: Option<i64>,
        /// Last index (exclusive).
        end: Option<i64>,
        /// Stride, never 0 (checked by the verifier).
        step: i64,
    },
    /// A single index on one axis; the axis is dropped. Negative counts from the end.
    Index(i64),
    /// `new`: inserts an axis of size 1.
    NewAxis,
    /// `...`: as many full ranges as needed to index every axis (at most one).
    Ellipsis,
}

/// How `split` cuts an axis.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SplitSpec {
    /// Pieces of this size, the last one smaller if the axis does not divide (torch `split(n)`).
    Size(usize),
    /// Pieces of exactly these sizes, which must sum to the axis length.
    Sizes(Vec<usize>),
    /// `chunk`: this many pieces of size `ceil(len / n)`; fewer if the axis is short
    /// (torch `chunk`).
    Chunks(usize),
}

/// What a collective computes. Collectives are location-free in the IR: their results do
/// not depend on where the operands live. Where they live is the dispatcher's business
/// (the shard pass places them): participant `i` holds `srcs[i]` and receives `dsts[i]`
/// (`broadcast` and `move` read one value and write every result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CollectiveOp {
    /// Every result is the elementwise reduction of all operands (same type).
    AllReduce(ReduceOp),
    /// Every result is the operands joined along `axis`.
    AllGather {
        /// The axis.
        axis: i64,
    },
    /// Result `i` is piece `i` of the operands' elementwise reduction, split along `axis`
    /// as `numpy.array_split` does (so uneven sizes work).
    ReduceScatter {
        /// The reduction.
        op: ReduceOp,
        /// The axis.
        axis: i64,
    },
    /// Every result is a copy of the one operand.
    Broadcast,
    /// The one result is the one operand, moved (point to point).
    Move,
}

impl CollectiveOp {
    /// The text mnemonic.
    pub fn mnemonic(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce(_) => "all_reduce",
            CollectiveOp::AllGather { .. } => "all_gather",
            CollectiveOp::ReduceScatter { .. } => "reduce_scatter",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::Move => "move",
        }
    }

    /// Every collective mnemonic.
    pub const MNEMONICS: &'static [&'static str] = &["all_reduce", "all_gather", "reduce_scatter", "broadcast", "move"];
}

/// Where the values of a signal's scope go (its config's `shard:`), carried by the scope's
/// start marker for the shard pass. Workers are the dispatcher's indices, in order; an empty
/// list means every worker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Placement {
    /// Split along `axis` (negative counts from the end), piece `i` on `workers[i]`, sizes
    /// as `numpy.array_split` gives them. One worker: the values live there (a pipeline
    /// stage).
    Split {
        /// The axis.
        axis: i64,
        /// The workers, in order.
        workers: Vec<u32>,
    },
    /// A copy on each of `workers`.
    Replicated {
        /// The workers.
        workers: Vec<u32>,
    },
}

/// An instruction's operands or results: inline up to four (every instruction but a
/// `fused` kernel's or a collective's), so listing them allocates nothing on the
/// per-instruction paths of the dispatcher and workers.
pub type InstrValues = smallvec::SmallVec<[ValueId; 4]>;

/// Every operation of the IR. Each defines at most its `dst` values (SSA: once each) and
/// reads the values named by its operands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Instr {
    /// Standard-normal random values; the same `seed` gives the same values on every backend.
    Randn {
        /// Result.
        dst: ValueId,
        /// Result type.
        ty: TensorType,
        /// Random seed.
        seed: u64,
    },
    /// Uniform random values in `[0, 1)`.
    Rand {
        /// Result.
        dst: ValueId,
        /// Result type.
        ty: TensorType,
        /// Random seed.
        seed: u64,
    },
    /// All zeros.
    Zeros {
        /// Result.
        dst: ValueId,
        /// Result type.
        ty: TensorType,
    },
    /// All ones.
    Ones {
        /// Result.
        dst: ValueId,
        /// Result type.
        ty: TensorType,
    },
    /// Every element `value`.
    Full {
        /// Result.
        dst: ValueId,
        /// Result type.
        ty: TensorType,
        /// The fill value.
        value: f64,
    },
    /// `start, start+step, ...` up to (excluding) `end`: a 1-d tensor of
    /// `ceil((end-start)/step)` elements (0 if negative).
    Arange {
        /// Result.
        dst: ValueId,
        /// Element type.
        dtype: DType,
        /// First value.
        start: f64,
        /// Exclusive bound.
        end: f64,
        /// Increment, never 0.
        step: f64,
    },
    /// A tensor from literal data in row-major order (`tensor f32[2] [1, 2]`).
    Literal {
        /// Result.
        dst: ValueId,
        /// Result type.
        ty: TensorType,
        /// `ty.shape.numel()` values of `ty.dtype`, row-major (on the wire: raw bytes).
        data: crate::data::Elements,
    },
    /// Elementwise op of one operand.
    Unary {
        /// Result.
        dst: ValueId,
        /// The op.
        op: UnaryOp,
        /// Operand.
        src: ValueId,
    },
    /// The operand converted to another dtype (`Tensor::to`, PyTorch's `.to(dtype)`):
    /// floats to integers truncate toward zero, integers wrap to a narrower one, anything
    /// nonzero becomes `true`.
    Cast {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// The result's dtype.
        dtype: DType,
    },
    /// Elementwise op of two operands, NumPy broadcasting.
    Binary {
        /// Result.
        dst: ValueId,
        /// The op.
        op: BinaryOp,
        /// Left operand.
        lhs: Operand,
        /// Right operand.
        rhs: Operand,
    },
    /// `cond ? on_true : on_false`, all three broadcast together.
    Where {
        /// Result.
        dst: ValueId,
        /// Condition, a `bool` tensor.
        cond: ValueId,
        /// Taken where true.
        on_true: Operand,
        /// Taken where false.
        on_false: Operand,
    },
    /// Matrix product: 1-d operands are promoted as in NumPy, leading (batch) dimensions
    /// broadcast.
    MatMul {
        /// Result.
        dst: ValueId,
        /// Left operand `[.., m, k]`.
        lhs: ValueId,
        /// Right operand `[.., k, n]`.
        rhs: ValueId,
    },
    /// Reduction over `axes` (every axis when `None`), keeping them as size 1 when `keepdim`.
    Reduce {
        /// Result.
        dst: ValueId,
        /// The op.
        op: ReduceOp,
        /// Operand.
        src: ValueId,
        /// Axes to reduce, negative counting from the end; `None` is all.
        axes: Option<Vec<i64>>,
        /// Keep reduced axes with size 1.
        keepdim: bool,
    },
    /// Swaps two axes.
    Transpose {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// First axis.
        dim0: i64,
        /// Second axis.
        dim1: i64,
    },
    /// Reorders axes: result axis `i` is operand axis `perm[i]`.
    Permute {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// A permutation of the axes (negative counting from the end).
        perm: Vec<i64>,
    },
    /// Same elements, new shape; one dimension may be `-1` (inferred).
    Reshape {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// Target dimensions.
        shape: Vec<i64>,
    },
    /// Removes axes of size 1: the given ones, or all when `None`.
    Squeeze {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// Axes to remove.
        axes: Option<Vec<i64>>,
    },
    /// Inserts an axis of size 1 at `axis` (in the result's numbering).
    Unsqueeze {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// Position of the new axis, `-rank-1..=rank`.
        axis: i64,
    },
    /// Broadcasts to a shape, NumPy rules.
    BroadcastTo {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// Target shape.
        shape: Vec<usize>,
    },
    /// Joins tensors along an existing axis.
    Concat {
        /// Result.
        dst: ValueId,
        /// Operands, at least one.
        srcs: Vec<ValueId>,
        /// The axis.
        axis: i64,
    },
    /// NumPy basic indexing: ranges with steps, single indices, new axes and `...`.
    Slice {
        /// Result.
        dst: ValueId,
        /// Operand.
        src: ValueId,
        /// One item per indexed axis.
        index: Vec<SliceItem>,
    },
    /// Cuts a tensor into pieces along an axis; one result per piece.
    Split {
        /// Results, one per piece.
        dsts: Vec<ValueId>,
        /// Operand.
        src: ValueId,
        /// The axis.
        axis: i64,
        /// Piece sizes.
        spec: SplitSpec,
    },
    /// One compiled kernel (what the fuse pass makes of several instructions): reads `srcs`
    /// (kernel input `i` is `srcs[i]`, addressed through the kernel's strides over its
    /// row-major buffer) and writes the `ty`-typed result. Written
    /// `%y = fused %a, %b : f32[4, 8] kernel map [4, 8] { .. }` (the kernel's text form).
    Fused {
        /// Result.
        dst: ValueId,
        /// Result type (the kernel writes inside its `numel` elements).
        ty: TensorType,
        /// The kernel's inputs, in order.
        srcs: Vec<ValueId>,
        /// What it computes.
        kernel: Box<Kernel>,
    },
    /// A collective over values that may live on different workers (see [`CollectiveOp`]):
    /// `%b0, %b1 = all_reduce sum %a0, %a1`, `%g0, %g1 = all_gather %a0, %a1 axis=0`,
    /// `%r0, %r1 = reduce_scatter sum %a0, %a1 axis=0`, `%c0, %c1 = broadcast %a`,
    /// `%b = move %a`.
    Collective {
        /// Results, one per participant.
        dsts: Vec<ValueId>,
        /// What it computes.
        op: CollectiveOp,
        /// Operands, one per participant (`broadcast`, `move`: one).
        srcs: Vec<ValueId>,
    },
    /// Releases a value; later reads are errors.
    Free {
        /// The value.
        src: ValueId,
    },
    /// Sync point: the client asks for a value's data.
    GetData {
        /// The value.
        src: ValueId,
    },
    /// Marks the start of one repetition of a hot path (a repeated instruction sequence;
    /// `id` is the sequence's structural hash, the same in every process). No effect on values.
    HotPathStart {
        /// The sequence.
        id: u64,
    },
    /// Marks the end of the repetition that the matching [`Instr::HotPathStart`] began.
    HotPathEnd {
        /// The sequence.
        id: u64,
    },
    /// The instructions up to the matching [`Instr::SignalEnd`] belong to signal `name`
    /// (a `signal "name" { }` block, `gt::signal::context`): placement and compilation
    /// configs name signals, and the instruction log shows each instruction's. No effect on
    /// values.
    SignalStart {
        /// The signal.
        name: String,
        /// The client's config says `compile: true` for it: the fuse pass compiles the
        /// scope's instructions (text: `signal_start "name" compile`). The client sends it
        /// because the client holds the config.
        compile: bool,
        /// A backward signal: the scope holds the gradient ops of what a forward scope
        /// computed (text: `signal_start "name" backward`); profiles file its time under
        /// backward, not forward.
        backward: bool,
        /// Where the scope's values go (text: `shard axis=0 workers=[0, 1]` or
        /// `replicated workers=[0, 1]` after the name), from the client's config.
        place: Option<Placement>,
    },
    /// Ends the innermost signal scope, which [`Instr::SignalStart`] with `name` began.
    SignalEnd {
        /// The signal.
        name: String,
    },
}

/// The one table of which fields of an instruction are results and which are operands.
/// Expanded for `&Instr` and for `&mut Instr` (binding modes make `$f` get `&ValueId` or
/// `&mut ValueId`); `$f(value, is_result)` sees results first, then operands, in text order.
macro_rules! for_each_value {
    ($instr:expr, $f:ident) => {
        match $instr {
            Instr::Randn { dst, .. }
            | Instr::Rand { dst, .. }
            | Instr::Zeros { dst, .. }
            | Instr::Ones { dst, .. }
            | Instr::Full { dst, .. }
            | Instr::Arange { dst, .. }
            | Instr::Literal { dst, .. } => $f(dst, true),
            Instr::Binary { dst, lhs, rhs, .. } => {
                $f(dst, true);
                for o in [lhs, rhs] {
                    if let Operand::Value(v) = o {
                        $f(v, false);
                    }
                }
            }
            Instr::Where { dst, cond, on_true, on_false } => {
                $f(dst, true);
                $f(cond, false);
                for o in [on_true, on_false] {
                    if let Operand::Value(v) = o {
                        $f(v, false);
                    }
                }
            }
            Instr::MatMul { dst, lhs, rhs } => {
                $f(dst, true);
                $f(lhs, false);
                $f(rhs, false);
            }
            Instr::Concat { dst, srcs, .. } | Instr::Fused { dst, srcs, .. } => {
                $f(dst, true);
                for s in srcs {
                    $f(s, false);
                }
            }
            Instr::Split { dsts, src, .. } => {
                for d in dsts {
                    $f(d, true);
                }
                $f(src, false);
            }
            Instr::Collective { dsts, srcs, .. } => {
                for d in dsts {
                    $f(d, true);
                }
                for s in srcs {
                    $f(s, false);
                }
            }
            Instr::Unary { dst, src, .. }
            | Instr::Cast { dst, src, .. }
            | Instr::Reduce { dst, src, .. }
            | Instr::Transpose { dst, src, .. }
            | Instr::Permute { dst, src, .. }
            | Instr::Reshape { dst, src, .. }
            | Instr::Squeeze { dst, src, .. }
            | Instr::Unsqueeze { dst, src, .. }
            | Instr::BroadcastTo { dst, src, .. }
            | Instr::Slice { dst, src, .. } => {
                $f(dst, true);
                $f(src, false);
            }
            Instr::Free { src } | Instr::GetData { src } => $f(src, false),
            Instr::HotPathStart { .. }
            | Instr::HotPathEnd { .. }
            | Instr::SignalStart { .. }
            | Instr::SignalEnd { .. } => {}
        }
    };
}

impl Instr {
    /// The text mnemonic (the op name in `.gtir`).
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Instr::Randn { .. } => "randn",
            Instr::Rand { .. } => "rand",
            Instr::Zeros { .. } => "zeros",
            Instr::Ones { .. } => "ones",
            Instr::Full { .. } => "full",
            Instr::Arange { .. } => "arange",
            Instr::Literal { .. } => "tensor",
            Instr::Unary { op, .. } => op.mnemonic(),
            Instr::Cast { .. } => "cast",
            Instr::Binary { op, .. } => op.mnemonic(),
            Instr::Where { .. } => "where",
            Instr::MatMul { .. } => "matmul",
            Instr::Reduce { op, .. } => op.mnemonic(),
            Instr::Transpose { .. } => "transpose",
            Instr::Permute { .. } => "permute",
            Instr::Reshape { .. } => "reshape",
            Instr::Squeeze { .. } => "squeeze",
            Instr::Unsqueeze { .. } => "unsqueeze",
            Instr::BroadcastTo { .. } => "broadcast_to",
            Instr::Concat { .. } => "concat",
            Instr::Slice { .. } => "slice",
            Instr::Split { spec: SplitSpec::Chunks(_), .. } => "chunk",
            Instr::Split { .. } => "split",
            Instr::Fused { .. } => "fused",
            Instr::Collective { op, .. } => op.mnemonic(),
            Instr::Free { .. } => "free",
            Instr::GetData { .. } => "get",
            Instr::HotPathStart { .. } => "hotpath_start",
            Instr::HotPathEnd { .. } => "hotpath_end",
            Instr::SignalStart { .. } => "signal_start",
            Instr::SignalEnd { .. } => "signal_end",
        }
    }

    /// How many values this instruction defines (the length of [`Instr::results`]).
    pub fn num_results(&self) -> usize {
        let mut n = 0;
        let mut count = |_: &ValueId, is_result: bool| n += usize::from(is_result);
        for_each_value!(self, count);
        n
    }

    /// The values this instruction defines, in result order.
    pub fn results(&self) -> InstrValues {
        let mut out = InstrValues::new();
        let mut take = |v: &ValueId, is_result: bool| {
            if is_result {
                out.push(*v)
            }
        };
        for_each_value!(self, take);
        out
    }

    /// The values this instruction reads, in operand order.
    pub fn operands(&self) -> InstrValues {
        let mut out = InstrValues::new();
        let mut take = |v: &ValueId, is_result: bool| {
            if !is_result {
                out.push(*v)
            }
        };
        for_each_value!(self, take);
        out
    }

    /// Calls `f` on each value the instruction defines, in result order, without collecting
    /// them (what every pass that keeps the stream's types does for each instruction).
    pub fn for_each_result(&self, mut f: impl FnMut(ValueId)) {
        let mut each = |v: &ValueId, is_result: bool| {
            if is_result {
                f(*v)
            }
        };
        for_each_value!(self, each);
    }

    /// Calls `f(value, is_result)` on each value the instruction names, results first, then
    /// operands, each in order: one walk, nothing collected (for a pass that files both into
    /// buffers of its own).
    pub fn for_each_value(&self, mut f: impl FnMut(ValueId, bool)) {
        let mut each = |v: &ValueId, is_result: bool| f(*v, is_result);
        for_each_value!(self, each);
    }

    /// Whether it only marks the stream (hot paths, signals) and computes nothing.
    pub fn is_marker(&self) -> bool {
        matches!(
            self,
            Instr::HotPathStart { .. } | Instr::HotPathEnd { .. } | Instr::SignalStart { .. } | Instr::SignalEnd { .. }
        )
    }

    /// Calls `f` on every value id the instruction names, results first, then operands,
    /// in text order, without collecting them (for passes that look at every instruction).
    pub fn visit_values(&self, f: &mut dyn FnMut(ValueId)) {
        let mut each = |v: &ValueId, _: bool| f(*v);
        for_each_value!(self, each);
    }

    /// Calls `f` on every value id the instruction names, results first, then operands,
    /// in text order (for renumbering and renaming ids).
    pub fn visit_values_mut(&mut self, f: &mut dyn FnMut(&mut ValueId)) {
        let mut each = |v: &mut ValueId, _: bool| f(v);
        for_each_value!(self, each);
    }
}
