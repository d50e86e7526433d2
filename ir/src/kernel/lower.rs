//! One instruction to kernels: the unfused lowering every kernel backend shares. Views
//! (transpose, permute, slice, broadcast) become strided reads, `concat` one strided write
//! per operand, `split` one strided read per piece; creation ops become maps with no
//! inputs. The instruction's types must already be checked ([`crate::verify::shape::infer`]).

use super::{row_major_strides, Access, BufferStorage, Compute, Kernel, MapKernel, MatMulKernel, Node, Storage};
use crate::verify::shape::{normalize_axes, normalize_axis, resolve_slice};
use crate::{BinaryOp, CollectiveOp, DType, Instr, Operand, ReduceOp, TensorType, ValueId};

/// One thing a backend does to execute an instruction.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Runs `kernel` on the buffers of `inputs`, writing into result number `output`.
    Launch {
        /// The kernel.
        kernel: Kernel,
        /// One value per kernel input.
        inputs: Vec<ValueId>,
        /// Index into the instruction's results.
        output: usize,
    },
    /// A reduction in two passes: `first` reads `inputs` and writes `partials` elements into
    /// a temporary, `second` reduces the temporary into result number `output`.
    TwoPass {
        /// Partial reductions of chunks of each row.
        first: Kernel,
        /// One value per input of `first`.
        inputs: Vec<ValueId>,
        /// Elements of the temporary.
        partials: usize,
        /// The reduction of the partials (its one input is the temporary).
        second: Kernel,
        /// Index into the instruction's results.
        output: usize,
    },
    /// Copies the instruction's literal data into result number `output`.
    Upload {
        /// Index into the instruction's results.
        output: usize,
    },
}

impl Step {
    /// How the buffers of this step's kernels are stored (one per kernel, in order), given
    /// the dtype of each input value and the instruction's result types: the first pass of
    /// two writes partials in what its kernel computes in, which the second reads.
    pub fn storage(&self, dtype_of: impl Fn(ValueId) -> DType, results: &[TensorType]) -> Vec<BufferStorage> {
        let inputs = |vs: &[ValueId]| vs.iter().map(|&v| Storage::of(dtype_of(v))).collect::<Vec<_>>();
        match self {
            Step::Launch { inputs: vs, output, .. } => {
                vec![BufferStorage { output: Storage::of(results[*output].dtype), inputs: inputs(vs) }]
            }
            Step::TwoPass { first, inputs: vs, output, .. } => {
                let partials = Step::partial_storage(first);
                vec![
                    BufferStorage { output: partials, inputs: inputs(vs) },
                    BufferStorage { output: Storage::of(results[*output].dtype), inputs: vec![partials] },
                ]
            }
            Step::Upload { .. } => vec![],
        }
    }

    /// How a two-pass reduction's partials are stored: as its first kernel computes them.
    pub fn partial_storage(first: &Kernel) -> Storage {
        match first {
            Kernel::Map(k) => Storage::of(k.compute.dtype()),
            Kernel::MatMul(_) => Storage::F32,
        }
    }
}

/// What the kernels of `instr` compute in, and the dtype its scalar operands convert to, as
/// the interpreter does: a binary op computes in (and converts scalars to) its promoted
/// operands' compute dtype; a cast or a reduction computes in its source's; anything else in
/// its result's, to which `full` values and `where`'s scalar branches convert.
fn dtypes_of(instr: &Instr, ty: &dyn Fn(ValueId) -> TensorType, results: &[TensorType]) -> (Compute, DType) {
    let result = results.first().map_or(DType::F32, |t| t.dtype);
    let scalars = match instr {
        Instr::Binary { op, lhs, rhs, .. } => {
            let typed = |v: ValueId| Ok(ty(v));
            crate::verify::shape::elementwise(&[*lhs, *rhs], &typed)
                .and_then(|t| crate::verify::shape::binary_dtypes(*op, t.dtype))
                .map_or(result, |(compute, _)| compute)
        }
        _ => result,
    };
    let compute = match instr {
        Instr::Cast { src, .. } | Instr::Reduce { src, .. } => Compute::of(ty(*src).dtype),
        Instr::Collective { srcs, .. } => srcs.first().map_or(Compute::F32, |&v| Compute::of(ty(v).dtype)),
        _ => Compute::of(scalars),
    };
    (compute, scalars)
}

/// The constant `x`, converted to `dtype` first, in a kernel computing in `compute`: an
/// `f32` one in `f32` kernels, else the `f64` itself.
fn constant_as(compute: Compute, dtype: DType, x: f64) -> Node {
    constant(compute, crate::data::converted_scalar(dtype, x))
}

/// The constant `x` in a kernel computing in `compute`: an `f32` one in `f32` kernels, else
/// the `f64` itself.
fn constant(compute: Compute, x: f64) -> Node {
    match compute {
        Compute::F32 => Node::constant(x as f32),
        Compute::F64 | Compute::I64 => Node::Const64(x.to_bits()),
    }
}

/// The steps that compute `instr`'s results (typed `results`, operands typed by `ty`).
/// Instructions with no results (`free`, `get`, markers) and empty results need no steps.
/// Kernels compute in what the interpreter computes the op in ([`Compute`]), whatever their
/// buffers hold ([`Step::storage`]): a `cast` is a copy whose input and output are stored
/// differently.
pub fn lower(instr: &Instr, ty: &dyn Fn(ValueId) -> TensorType, results: &[TensorType]) -> Vec<Step> {
    let out_dims = || results.first().map(|t| t.shape.0.clone()).unwrap_or_default();
    let (compute, scalars) = dtypes_of(instr, ty, results);
    let mut steps = Vec::new();
    let mut map = |parts: MapParts| {
        let (values, accesses): (Vec<_>, Vec<_>) = parts.inputs.into_iter().unzip();
        let kernel = MapKernel {
            shape: parts.shape,
            inputs: accesses,
            nodes: parts.nodes,
            output: parts.output,
            rows: vec![],
            reduce: None,
            compute,
        };
        if kernel.numel() > 0 {
            steps.push(Step::Launch { kernel: Kernel::Map(kernel), inputs: values, output: 0 });
        }
    };
    let creation = |node: Node| {
        let dims = out_dims();
        let output = Access::contiguous(&dims);
        MapParts { shape: dims.to_vec(), inputs: vec![], nodes: vec![node], output }
    };
    match instr {
        Instr::Randn { seed, .. } => map(creation(Node::Randn { seed: *seed })),
        Instr::Rand { seed, .. } => map(creation(Node::Rand { seed: *seed })),
        Instr::Zeros { .. } => map(creation(constant(compute, 0.0))),
        Instr::Ones { .. } => map(creation(constant(compute, 1.0))),
        Instr::Full { value, .. } => map(creation(constant_as(compute, scalars, *value))),
        Instr::Arange { start, step, .. } => map(creation(Node::Iota { start: start.to_bits(), step: step.to_bits() })),
        Instr::Literal { ty: t, .. } => {
            if t.shape.numel() > 0 {
                steps.push(Step::Upload { output: 0 });
            }
        }
        Instr::Unary { op, src, .. } => {
            let dims = out_dims();
            let input = (*src, Access::contiguous(&dims));
            map(MapParts::new(
                dims.to_vec(),
                vec![input],
                vec![Node::Input(0), Node::Unary(*op, 0)],
                Access::contiguous(&dims),
            ))
        }
        Instr::Cast { src, .. } => {
            let dims = out_dims();
            let input = (*src, Access::contiguous(&dims));
            map(MapParts::new(dims.to_vec(), vec![input], vec![Node::Input(0)], Access::contiguous(&dims)))
        }
        Instr::Binary { op, lhs, rhs, .. } => {
            let dims = out_dims();
            let mut operands = Operands::new(&dims, ty, (compute, scalars));
            // A half's `mul`/`div` by a scalar keeps it in `f32` (`binary_scalar`).
            let mut operand = |o: Operand, rhs: bool| match o {
                Operand::Scalar(x) => {
                    operands.push(constant(compute, crate::data::binary_scalar(*op, scalars, x, rhs)))
                }
                o => operands.add(o),
            };
            let (a, b) = (operand(*lhs, false), operand(*rhs, true));
            operands.nodes.push(Node::Binary(*op, a, b));
            let (inputs, nodes) = (operands.inputs, operands.nodes);
            map(MapParts::new(dims.to_vec(), inputs, nodes, Access::contiguous(&dims)))
        }
        Instr::Where { cond, on_true, on_false, .. } => {
            let dims = out_dims();
            let mut operands = Operands::new(&dims, ty, (compute, scalars));
            let c = operands.add(Operand::Value(*cond));
            let (t, f) = (operands.add(*on_true), operands.add(*on_false));
            operands.nodes.push(Node::Select(c, t, f));
            let (inputs, nodes) = (operands.inputs, operands.nodes);
            map(MapParts::new(dims.to_vec(), inputs, nodes, Access::contiguous(&dims)))
        }
        Instr::MatMul { lhs, rhs, .. } => {
            if let Some(kernel) = matmul(&ty(*lhs).shape.0, &ty(*rhs).shape.0) {
                steps.push(Step::Launch { kernel: Kernel::MatMul(kernel), inputs: vec![*lhs, *rhs], output: 0 });
            }
        }
        Instr::Reduce { op, src, axes, .. } => {
            let dims = ty(*src).shape.0;
            let rank = dims.len();
            let mut axes = match axes {
                None => (0..rank).collect(),
                Some(a) => normalize_axes(a, rank).unwrap_or_default(),
            };
            axes.sort_unstable();
            // Output strides over the kept axes in order; reduced axes get 0.
            let kept: Vec<usize> = (0..rank).filter(|i| !axes.contains(i)).map(|i| dims[i]).collect();
            let kept_strides = row_major_strides(&kept);
            let mut next = kept_strides.into_iter();
            let strides = (0..rank).map(|i| if axes.contains(&i) { 0 } else { next.next().unwrap_or(0) }).collect();
            let kernel = MapKernel {
                shape: dims.to_vec(),
                inputs: vec![Access::contiguous(&dims)],
                nodes: vec![Node::Input(0)],
                output: Access { offset: 0, strides },
                rows: axes,
                reduce: Some(*op),
                compute,
            };
            let (outputs, reduced) = kernel.extents();
            let trailing = kernel.rows.iter().enumerate().all(|(i, &a)| a == rank - kernel.rows.len() + i);
            if outputs == 0 {
            } else if let (true, Some((first, second))) = (trailing, split_reduction(*op, outputs, reduced, compute)) {
                steps.push(Step::TwoPass {
                    first,
                    inputs: vec![*src],
                    partials: outputs * partial_count(reduced),
                    second,
                    output: 0,
                });
            } else {
                steps.push(Step::Launch { kernel: Kernel::Map(kernel), inputs: vec![*src], output: 0 });
            }
        }
        Instr::Transpose { src, dim0, dim1, .. } => {
            let dims = ty(*src).shape.0;
            let mut perm: Vec<usize> = (0..dims.len()).collect();
            if let (Ok(a), Ok(b)) = (normalize_axis(*dim0, dims.len()), normalize_axis(*dim1, dims.len())) {
                perm.swap(a, b);
            }
            map(permuted(*src, &dims, &perm))
        }
        Instr::Permute { src, perm, .. } => {
            let dims = ty(*src).shape.0;
            // In the given order (normalize_axes would sort them).
            let perm: Vec<usize> = perm.iter().map(|&p| normalize_axis(p, dims.len()).unwrap_or(0)).collect();
            map(permuted(*src, &dims, &perm))
        }
        Instr::Reshape { src, .. } | Instr::Squeeze { src, .. } | Instr::Unsqueeze { src, .. } => {
            // Same elements in the same order: a contiguous copy.
            let dims = out_dims();
            map(MapParts::new(
                dims.to_vec(),
                vec![(*src, Access::contiguous(&dims))],
                vec![Node::Input(0)],
                Access::contiguous(&dims),
            ))
        }
        Instr::BroadcastTo { src, .. } => {
            let dims = out_dims();
            let access = broadcast_access(&ty(*src).shape.0, &dims);
            map(MapParts::new(dims.to_vec(), vec![(*src, access)], vec![Node::Input(0)], Access::contiguous(&dims)))
        }
        Instr::Slice { src, index, .. } => {
            let src_dims = ty(*src).shape.0;
            if let Ok(resolved) = resolve_slice(index, &crate::Shape(src_dims.clone())) {
                let src_strides = row_major_strides(&src_dims);
                let offset = resolved.axes.iter().zip(&src_strides).map(|(a, s)| a.start as i64 * s).sum();
                // The result is the taken elements with size-1 axes dropped or inserted: its
                // axes of size > 1 are the taken axes of size > 1, in order.
                let mut taken =
                    resolved.axes.iter().zip(&src_strides).filter(|(a, _)| a.len != 1).map(|(a, s)| a.step * s);
                let dims = resolved.shape.0.clone();
                let strides = dims.iter().map(|&d| if d == 1 { 0 } else { taken.next().unwrap_or(0) }).collect();
                let access = Access { offset, strides };
                map(MapParts::new(dims.to_vec(), vec![(*src, access)], vec![Node::Input(0)], Access::contiguous(&dims)))
            }
        }
        Instr::Concat { srcs, axis, .. } => {
            let dims = out_dims();
            let axis = normalize_axis(*axis, dims.len()).unwrap_or(0);
            let out_strides = row_major_strides(&dims);
            let mut start = 0i64;
            for src in srcs {
                let piece = ty(*src).shape.0;
                let output = Access { offset: start * out_strides[axis], strides: out_strides.clone() };
                map(MapParts::new(
                    piece.to_vec(),
                    vec![(*src, Access::contiguous(&piece))],
                    vec![Node::Input(0)],
                    output,
                ));
                start += piece.get(axis).copied().unwrap_or(0) as i64;
            }
        }
        Instr::Split { src, axis, .. } => {
            let src_dims = ty(*src).shape.0;
            let axis = normalize_axis(*axis, src_dims.len()).unwrap_or(0);
            let src_strides = row_major_strides(&src_dims);
            let mut start = 0i64;
            for (i, piece) in results.iter().enumerate() {
                let dims = piece.shape.0.clone();
                let input = Access { offset: start * src_strides[axis], strides: src_strides.clone() };
                let kernel = MapKernel {
                    shape: dims.to_vec(),
                    inputs: vec![input],
                    nodes: vec![Node::Input(0)],
                    output: Access::contiguous(&dims),
                    rows: vec![],
                    reduce: None,
                    compute,
                };
                if kernel.numel() > 0 {
                    steps.push(Step::Launch { kernel: Kernel::Map(kernel), inputs: vec![*src], output: i });
                }
                start += dims.get(axis).copied().unwrap_or(0) as i64;
            }
        }
        Instr::Fused { ty: t, srcs, kernel, .. } => {
            if t.shape.numel() > 0 {
                match &**kernel {
                    Kernel::Map(k) => match split_full_reduction(k) {
                        Some((first, partials, second)) => {
                            steps.push(Step::TwoPass { first, inputs: srcs.clone(), partials, second, output: 0 })
                        }
                        None => {
                            steps.push(Step::Launch { kernel: (**kernel).clone(), inputs: srcs.clone(), output: 0 })
                        }
                    },
                    k => steps.push(Step::Launch { kernel: k.clone(), inputs: srcs.clone(), output: 0 }),
                }
            }
        }
        Instr::Collective { op, srcs, .. } => {
            for (i, result) in results.iter().enumerate() {
                for (kernel, inputs) in collective(*op, srcs, ty, (i, results.len()), &result.shape.0, compute) {
                    if kernel.numel() > 0 {
                        steps.push(Step::Launch { kernel: Kernel::Map(kernel), inputs, output: i });
                    }
                }
            }
        }
        Instr::Free { .. }
        | Instr::GetData { .. }
        | Instr::HotPathStart { .. }
        | Instr::HotPathEnd { .. }
        | Instr::SignalStart { .. }
        | Instr::SignalEnd { .. } => {}
    }
    steps
}

/// The map kernels (with their inputs) writing result `i` of `n` (dims `out`) of a
/// collective: a copy (`broadcast`, `move`), one strided write per operand (`all_gather`),
/// or the operands folded left to right, over the whole value (`all_reduce`) or over piece
/// `i` (`reduce_scatter`); a mean divides the sum by the operand count.
fn collective(
    op: CollectiveOp,
    srcs: &[ValueId],
    ty: &dyn Fn(ValueId) -> TensorType,
    (i, n): (usize, usize),
    out: &[usize],
    compute: Compute,
) -> Vec<(MapKernel, Vec<ValueId>)> {
    let copy = |dims: Vec<usize>, input: Access, output: Access| MapKernel {
        shape: dims,
        inputs: vec![input],
        nodes: vec![Node::Input(0)],
        output,
        rows: vec![],
        reduce: None,
        compute,
    };
    let fold = |reduce: ReduceOp, dims: Vec<usize>, input: Access| {
        let mut nodes: Vec<Node> = (0..srcs.len() as u32).map(Node::Input).collect();
        let combine = match reduce {
            ReduceOp::Max => BinaryOp::Maximum,
            ReduceOp::Min => BinaryOp::Minimum,
            ReduceOp::Sum | ReduceOp::Mean => BinaryOp::Add,
        };
        let mut acc = 0u32;
        for k in 1..srcs.len() as u32 {
            nodes.push(Node::Binary(combine, acc, k));
            acc = nodes.len() as u32 - 1;
        }
        if reduce == ReduceOp::Mean {
            nodes.push(constant(compute, srcs.len() as f64));
            let count = nodes.len() as u32 - 1;
            nodes.push(Node::Binary(BinaryOp::Div, acc, count));
        }
        let output = Access::contiguous(&dims);
        let kernel = MapKernel {
            shape: dims,
            inputs: vec![input; srcs.len()],
            nodes,
            output,
            rows: vec![],
            reduce: None,
            compute,
        };
        vec![(kernel, srcs.to_vec())]
    };
    match op {
        CollectiveOp::Broadcast | CollectiveOp::Move => {
            let dims = out.to_vec();
            let access = Access::contiguous(&dims);
            vec![(copy(dims, access.clone(), access), vec![srcs[0]])]
        }
        CollectiveOp::AllReduce(reduce) => fold(reduce, out.to_vec(), Access::contiguous(out)),
        CollectiveOp::ReduceScatter { op: reduce, axis } => {
            let src_dims = ty(srcs[0]).shape.0;
            let axis = normalize_axis(axis, src_dims.len()).unwrap_or(0);
            let start: usize = crate::verify::shape::array_split(src_dims[axis], n)[..i].iter().sum();
            let strides = row_major_strides(&src_dims);
            fold(reduce, out.to_vec(), Access { offset: start as i64 * strides[axis], strides })
        }
        CollectiveOp::AllGather { axis } => {
            let axis = normalize_axis(axis, out.len()).unwrap_or(0);
            let out_strides = row_major_strides(out);
            let mut start = 0i64;
            srcs.iter()
                .map(|&src| {
                    let piece = ty(src).shape.0;
                    let output = Access { offset: start * out_strides[axis], strides: out_strides.clone() };
                    start += piece.get(axis).copied().unwrap_or(0) as i64;
                    (copy(piece.to_vec(), Access::contiguous(&piece), output), vec![src])
                })
                .collect()
        }
    }
}

/// A map kernel under construction: inputs still named by value.
struct MapParts {
    shape: Vec<usize>,
    inputs: Vec<(ValueId, Access)>,
    nodes: Vec<Node>,
    output: Access,
}

impl MapParts {
    fn new(shape: Vec<usize>, inputs: Vec<(ValueId, Access)>, nodes: Vec<Node>, output: Access) -> MapParts {
        MapParts { shape, inputs, nodes, output }
    }
}

/// Rows at least this long, when there are few of them, are reduced in two passes so that
/// many blocks share each row (one block per row would leave most of a GPU idle).
pub const SPLIT_ROW: usize = 1 << 16;

/// Into how many equal chunks a row of `reduced` elements is split: the largest divisor of
/// `reduced` up to 1024 that leaves chunks of at least 1024 (1: no split).
fn partial_count(reduced: usize) -> usize {
    (2..=1024.min(reduced / 1024)).rev().find(|p| reduced.is_multiple_of(*p)).unwrap_or(1)
}

/// The two kernels of a reduction of `outputs` contiguous rows of `reduced` elements, when it
/// pays: chunk reductions into `[outputs, P]` partials, then the partials' reduction. Means
/// stay exact as means of equal-sized chunks.
fn split_reduction(op: crate::ReduceOp, outputs: usize, reduced: usize, compute: Compute) -> Option<(Kernel, Kernel)> {
    let p = partial_count(reduced);
    if outputs > 64 || reduced < SPLIT_ROW || p < 8 {
        return None;
    }
    let chunk = reduced / p;
    let first = MapKernel {
        shape: vec![outputs, p, chunk],
        inputs: vec![Access { offset: 0, strides: vec![reduced as i64, chunk as i64, 1] }],
        nodes: vec![Node::Input(0)],
        output: Access { offset: 0, strides: vec![p as i64, 1, 0] },
        rows: vec![2],
        reduce: Some(op),
        compute,
    };
    Some((Kernel::Map(first), partials_reduction(op, outputs, p, compute)))
}

/// The second pass of a two-pass reduction: each of `outputs` rows of `p` partials reduced
/// to one value.
fn partials_reduction(op: crate::ReduceOp, outputs: usize, p: usize, compute: Compute) -> Kernel {
    Kernel::Map(MapKernel {
        shape: vec![outputs, p],
        inputs: vec![Access::contiguous(&[outputs, p])],
        nodes: vec![Node::Input(0)],
        output: Access { offset: 0, strides: vec![1, 0] },
        rows: vec![1],
        reduce: Some(op),
        compute,
    })
}

/// A fused kernel reducing everything it computes to one value, in two passes like
/// [`split_reduction`]: its first long axis is cut into `P` blocks, each reduced into one of
/// `P` partials (the same expression over `[.., P, len / P, ..]`, which keeps every linear
/// index, so `iota` and `rand` are unchanged, and any input strides), then the partials'
/// reduction. Not when something reduces within the row (that needs the whole row).
fn split_full_reduction(k: &MapKernel) -> Option<(Kernel, usize, Kernel)> {
    let op = k.reduce?;
    let (outputs, n) = k.extents();
    if outputs != 1 || n < SPLIT_ROW || k.nodes.iter().any(|node| matches!(node, Node::Reduce(..))) {
        return None;
    }
    let a = k.shape.iter().position(|&d| d > 1)?;
    let d = k.shape[a];
    let p = (8..=1024.min(d)).rev().find(|p| d.is_multiple_of(*p) && n / p >= 1024)?;
    let split = |v: &[usize]| -> Vec<usize> {
        v[..a].iter().copied().chain([p, d / p]).chain(v[a + 1..].iter().copied()).collect()
    };
    let inputs = k
        .inputs
        .iter()
        .map(|x| {
            let s = x.strides[a];
            let strides = x.strides[..a]
                .iter()
                .copied()
                .chain([s * (d / p) as i64, s])
                .chain(x.strides[a + 1..].iter().copied())
                .collect();
            Access { offset: x.offset, strides }
        })
        .collect();
    let shape = split(&k.shape);
    let rank = shape.len();
    let first = MapKernel {
        inputs,
        nodes: k.nodes.clone(),
        output: Access { offset: 0, strides: (0..rank).map(|i| i64::from(i == a)).collect() },
        rows: (0..rank).filter(|&i| i != a).collect(),
        reduce: Some(op),
        compute: k.compute,
        shape,
    };
    Some((Kernel::Map(first), p, partials_reduction(op, 1, p, k.compute)))
}

/// Collects a map kernel's inputs and leaf nodes from operands (scalars become constants).
struct Operands<'a> {
    dims: &'a [usize],
    ty: &'a dyn Fn(ValueId) -> TensorType,
    /// What the kernel computes in, and the dtype scalar operands convert to.
    compute: (Compute, DType),
    inputs: Vec<(ValueId, Access)>,
    nodes: Vec<Node>,
}

impl<'a> Operands<'a> {
    fn new(dims: &'a [usize], ty: &'a dyn Fn(ValueId) -> TensorType, compute: (Compute, DType)) -> Operands<'a> {
        Operands { dims, ty, compute, inputs: Vec::new(), nodes: Vec::new() }
    }

    fn add(&mut self, operand: Operand) -> u32 {
        let node = match operand {
            Operand::Scalar(x) => constant_as(self.compute.0, self.compute.1, x),
            Operand::Value(v) => {
                let ty = (self.ty)(v);
                let access = broadcast_access(&ty.shape.0, self.dims);
                // One input per distinct value (`mul %x, %x` reads %x once).
                let i = match self.inputs.iter().position(|(w, a)| *w == v && *a == access) {
                    Some(i) => i,
                    None => {
                        self.inputs.push((v, access));
                        self.inputs.len() - 1
                    }
                };
                let input = Node::Input(i as u32);
                // An integer, or a wider float (an `f32` 0-d tensor), meeting an op on halves
                // is rounded to the half first, as the interpreter converts it.
                let half = self.compute.1;
                if half.is_half() && ty.dtype != half && ty.dtype != DType::Bool {
                    let at = self.push(input);
                    Node::Round(Storage::of(half), at)
                } else {
                    input
                }
            }
        };
        self.push(node)
    }

    /// `node`'s index, pushed unless an equal node is there.
    fn push(&mut self, node: Node) -> u32 {
        if let Some(i) = self.nodes.iter().position(|n| *n == node) {
            return i as u32;
        }
        self.nodes.push(node);
        (self.nodes.len() - 1) as u32
    }
}

/// Reading a tensor of shape `src` broadcast (NumPy rules) to `dims`.
pub fn broadcast_access(src: &[usize], dims: &[usize]) -> Access {
    let src_strides = row_major_strides(src);
    let lead = dims.len().saturating_sub(src.len());
    let strides = (0..dims.len())
        .map(|i| match i.checked_sub(lead) {
            Some(j) if src[j] != 1 => src_strides[j],
            _ => 0,
        })
        .collect();
    Access { offset: 0, strides }
}

/// A copy whose result axis `i` is source axis `perm[i]`.
fn permuted(src: ValueId, dims: &[usize], perm: &[usize]) -> MapParts {
    let strides = row_major_strides(dims);
    let out: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let access = Access { offset: 0, strides: perm.iter().map(|&p| strides[p]).collect() };
    let output = Access::contiguous(&out);
    MapParts::new(out, vec![(src, access)], vec![Node::Input(0)], output)
}

/// The kernel of a NumPy matmul of shapes `a` and `b` (`None` when the result is empty).
fn matmul(a: &[usize], b: &[usize]) -> Option<MatMulKernel> {
    let a: Vec<usize> = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b: Vec<usize> = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (ra, rb) = (a.len(), b.len());
    let (m, k, n) = (a[ra - 2], a[ra - 1], b[rb - 1]);
    let rank = (ra - 2).max(rb - 2);
    let batch: Vec<usize> = (0..rank)
        .map(|i| {
            let pick = |d: &[usize], r: usize| (i + r).checked_sub(rank).map_or(1, |j| d[j]);
            // NumPy broadcasting: sizes are equal or one is 1 (checked by the type rule),
            // so 0 against 1 is 0, an empty batch.
            let (x, y) = (pick(&a, ra - 2), pick(&b, rb - 2));
            if x == 1 {
                y
            } else {
                x
            }
        })
        .collect();
    let with = |rows: usize, cols: usize| batch.iter().copied().chain([rows, cols]).collect::<Vec<_>>();
    let kernel = MatMulKernel {
        lhs: broadcast_access(&a, &with(m, k)),
        rhs: broadcast_access(&b, &with(k, n)),
        epilogue: vec![],
        epilogue_inputs: vec![],
        precision: Default::default(),
        batch,
        m,
        n,
        k,
    };
    (kernel.batch_count() * m * n > 0).then_some(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::shape::infer;
    use crate::{text, BinaryOp, SliceItem};

    fn lower_text(src: &str, types: &[(&str, &[usize])]) -> String {
        let program = text::parse(src).unwrap();
        let instr = program.instrs()[0].0.clone();
        let ty = |v: ValueId| {
            let name = &program.names[v.0 as usize];
            types.iter().find(|(n, _)| n == name).map(|(_, d)| TensorType::f32(d.to_vec())).unwrap()
        };
        let results = infer(&instr, &|v| Ok(ty(v))).unwrap();
        lower(&instr, &ty, &results)
            .iter()
            .map(|s| match s {
                Step::Launch { kernel, inputs, output } => format!("{kernel}\n  reads {inputs:?} -> result {output}"),
                Step::Upload { output } => format!("upload -> result {output}"),
                Step::TwoPass { first, second, partials, output, .. } => {
                    format!("{first}\n  -> {partials} partials\n{second}\n  -> result {output}")
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn binary_broadcasts_with_zero_strides_and_scalars_are_constants() {
        let k = lower_text("%c = add %a, %b\n", &[("a", &[2, 3]), ("b", &[3])]);
        assert!(k.contains("in0 +0 strides [3, 1]"), "{k}");
        assert!(k.contains("in1 +0 strides [0, 1]"), "{k}");
        let k = lower_text("%c = mul %a, 0.5\n", &[("a", &[4])]);
        assert!(k.contains("const 0.5"), "{k}");
    }

    #[test]
    fn transpose_and_slice_are_strided_reads() {
        let k = lower_text("%c = transpose %a\n", &[("a", &[2, 3])]);
        assert!(k.contains("kernel map [3, 2]") && k.contains("in0 +0 strides [1, 3]"), "{k}");
        // x[1, ::-2] of a [3, 5]: offset 1*5 + 4, stride -2.
        let instr = Instr::Slice {
            dst: ValueId(1),
            src: ValueId(0),
            index: vec![SliceItem::Index(1), SliceItem::Range { start: None, end: None, step: -2 }],
        };
        let ty = |_| TensorType::f32(vec![3, 5]);
        let results = infer(&instr, &|v| Ok(ty(v))).unwrap();
        let steps = lower(&instr, &ty, &results);
        let Step::Launch { kernel: Kernel::Map(k), .. } = &steps[0] else { panic!() };
        assert_eq!(k.inputs[0], Access { offset: 9, strides: vec![-2] });
        assert_eq!(k.shape, vec![3]);
    }

    #[test]
    fn permute_keeps_the_order_given() {
        let k = lower_text("%c = permute %a perm=[2, 0, -2]\n", &[("a", &[2, 3, 4])]);
        assert!(k.contains("kernel map [4, 2, 3]") && k.contains("in0 +0 strides [1, 12, 4]"), "{k}");
    }

    #[test]
    fn concat_writes_each_operand_at_its_offset() {
        let k = lower_text("%c = concat %a, %b axis=1\n", &[("a", &[2, 3]), ("b", &[2, 2])]);
        assert!(k.contains("out +0 strides [5, 1]") && k.contains("out +3 strides [5, 1]"), "{k}");
    }

    #[test]
    fn reduce_and_matmul_kernels() {
        let k = lower_text("%c = sum %a axes=[1] keepdim\n", &[("a", &[2, 3, 4])]);
        assert!(k.contains("rows [1] sum") && k.contains("out +0 strides [4, 0, 1]"), "{k}");
        let k = lower_text("%c = matmul %a, %b\n", &[("a", &[5, 2, 3]), ("b", &[3, 4])]);
        assert!(k.contains("batch [5] m=2 n=4 k=3") && k.contains("rhs +0 strides [0, 4, 1]"), "{k}");
    }

    #[test]
    fn long_rows_reduce_in_two_passes() {
        let k = lower_text("%c = mean %a\n", &[("a", &[1024, 1024])]);
        assert!(k.contains("kernel map [1, 1024, 1024] rows [2] mean") && k.contains("-> 1024 partials"), "{k}");
        assert!(k.contains("kernel map [1, 1024] rows [1] mean"), "{k}");
        // Many rows, or short ones, or rows not at the end: one pass.
        for (src, dims) in [
            ("%c = sum %a axes=[1]\n", &[128, 1 << 16][..]),
            ("%c = sum %a\n", &[1000][..]),
            ("%c = sum %a axes=[0]\n", &[1 << 16, 2][..]),
        ] {
            let k = lower_text(src, &[("a", dims)]);
            assert!(!k.contains("partials"), "{k}");
        }
    }

    #[test]
    fn matmul_with_an_empty_batch_launches_nothing() {
        for (a, b) in [(&[0, 2, 3][..], &[3, 4][..]), (&[1, 2, 3][..], &[0, 3, 4][..]), (&[3][..], &[0, 3, 4][..])] {
            let k = lower_text("%c = matmul %a, %b\n", &[("a", a), ("b", b)]);
            assert_eq!(k, "", "{a:?} @ {b:?}");
        }
    }

    #[test]
    fn same_value_twice_is_one_input() {
        let instr = Instr::Binary {
            dst: ValueId(1),
            op: BinaryOp::Mul,
            lhs: Operand::Value(ValueId(0)),
            rhs: Operand::Value(ValueId(0)),
        };
        let ty = |_| TensorType::f32(vec![4]);
        let steps = lower(&instr, &ty, &[TensorType::f32(vec![4])]);
        let Step::Launch { kernel: Kernel::Map(k), .. } = &steps[0] else { panic!() };
        assert_eq!(k.inputs.len(), 1);
        assert_eq!(k.nodes, vec![Node::Input(0), Node::Binary(BinaryOp::Mul, 0, 0)]);
    }
}
