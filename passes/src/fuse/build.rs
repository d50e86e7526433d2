//! From a region's instructions to `fused` instructions: the partitioner. Elementwise
//! expressions (simplified by the e-graph) are evaluated inside the kernel of the value that
//! needs them; views become strided reads; a reduction whose result is broadcast back over
//! its rows becomes an in-row reduction (softmax, layer norm); a matmul whose only use is an
//! elementwise expression of its shape takes that expression as its epilogue. A value is
//! materialised (written to memory) only when it is live after the region, read by an
//! instruction that is not fused, or cannot be recomputed where it is read.
//!
//! A kernel computes in one type, as the interpreter computes each op ([`Compute`]): `f32`
//! (for `f32` and the halves), `f64`, or `i64` (for `i64` and `i32`, an `i32` result wrapped
//! back to 32 bits after each op by a `round` node, so a chain wraps where the eager ops
//! do). The e-graph simplifies only `f32` expressions (its constants and rewrites are
//! `f32`'s); `f64` and integer ones are kept as written. A value computed in another type
//! than the kernel's is read from memory.

use super::egraph::{self, Expr, Facts, Limits, Op, Saturation};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use gt_ir::kernel::{row_major_strides, Access, Compute, Kernel, MapKernel, MatMulKernel, Node, Precision, Storage};
use gt_ir::verify::shape::{binary_dtypes, elementwise, normalize_axes, normalize_axis, resolve_slice};
use gt_ir::{DType, Instr, Operand, ReduceOp, Shape, TensorType, ValueId};

/// How deep the partitioner follows the values and expression nodes of one kernel before it
/// materialises the value it reached: bounds its recursion whatever the region, and a long
/// chain becomes several kernels.
const MAX_DEPTH: usize = 128;

/// One expression node after extraction: operands are earlier entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum E {
    Leaf(ValueId),
    Const(u32),
    /// A constant of an `f64` or integer expression (`f64` bits, converted to the
    /// expression's dtype already).
    Const64(u64),
    /// Wrapped back into a narrower dtype (an `i32` op computed in `i64`).
    Round(Storage, usize),
    Unary(gt_ir::UnaryOp, usize),
    Binary(gt_ir::BinaryOp, usize, usize),
    Select(usize, usize, usize),
}

/// How a region value is computed.
#[derive(Debug, Clone)]
enum Def {
    /// Elementwise: an expression (arena index).
    Elem(usize),
    /// A reduction over sorted axes.
    Reduce { op: ReduceOp, src: ValueId, axes: Vec<usize>, keepdim: bool },
    /// A matrix product of operands of rank >= 2.
    MatMul { lhs: ValueId, rhs: ValueId },
    /// A view: the map from this value's coordinates to `src`'s.
    View { src: ValueId },
    /// Same elements, other shape.
    Reshape { src: ValueId },
    /// The same value everywhere (as its dtype holds it).
    Constant(f64),
    /// Depends on the linear index (`rand`, `randn`, `arange`).
    Indexed(Node),
    /// Kept as it is.
    Opaque,
}

/// An affine map from kernel iteration coordinates (`cols` of them) to a value's
/// coordinates: `coord[a] = offset[a] + sum_j coef[a][j] * it[j]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Map {
    offset: Vec<i64>,
    coef: Vec<Vec<i64>>,
    cols: usize,
}

impl Map {
    fn identity(rank: usize) -> Map {
        let coef = (0..rank).map(|a| (0..rank).map(|j| i64::from(a == j)).collect()).collect();
        Map { offset: vec![0; rank], coef, cols: rank }
    }

    fn zero_row(&self) -> (i64, Vec<i64>) {
        (0, vec![0; self.cols])
    }

    fn row(&self, a: usize) -> (i64, Vec<i64>) {
        match (self.offset.get(a), self.coef.get(a)) {
            (Some(&o), Some(c)) => (o, c.clone()),
            _ => self.zero_row(),
        }
    }

    fn from_rows(rows: Vec<(i64, Vec<i64>)>, cols: usize) -> Map {
        let (offset, coef) = rows.into_iter().unzip();
        Map { offset, coef, cols }
    }

    /// NumPy broadcasting: from a value of shape `from` (this map's target) to an operand of
    /// shape `to` aligned from the right.
    fn broadcast(&self, from: &[usize], to: &[usize]) -> Map {
        let shift = from.len().saturating_sub(to.len());
        let rows = (0..to.len())
            .map(|b| if to[b] == 1 || b + shift >= from.len() { self.zero_row() } else { self.row(b + shift) })
            .collect();
        Map::from_rows(rows, self.cols)
    }

    /// Whether the map visits some element more than once over `space` (a broadcast).
    fn repeats(&self, space: &[usize]) -> bool {
        (0..space.len()).any(|j| space[j] > 1 && self.coef.iter().all(|r| r[j] == 0))
    }

    /// The strided access of a row-major buffer of shape `dims` under this map.
    fn access(&self, dims: &[usize]) -> Access {
        let rm = row_major_strides(dims);
        let offset = self.offset.iter().zip(&rm).map(|(o, s)| o * s).sum();
        let strides = (0..self.cols).map(|j| self.coef.iter().zip(&rm).map(|(r, s)| r[j] * s).sum()).collect();
        Access { offset, strides }
    }
}

/// The values of one region and what the partitioner decided.
pub struct Region<'a> {
    types: &'a HashMap<ValueId, TensorType>,
    defs: HashMap<ValueId, Def>,
    /// The instruction defining each region value (for fallbacks and opaque ones).
    instrs: HashMap<ValueId, Instr>,
    arena: Vec<E>,
    /// The value each elementwise expression root computes (where a deep expression is cut).
    arena_value: HashMap<usize, ValueId>,
    uses: HashMap<ValueId, usize>,
    live_out: HashSet<ValueId>,
    materialised: HashSet<ValueId>,
    /// Matmuls computed inside their consumer's kernel (in memory only if another kernel
    /// needs them after all).
    absorbed: HashSet<ValueId>,
    /// Values being materialised (guards against cycles through views).
    visiting: HashSet<ValueId>,
    /// What each elementwise value computes in; `None` for one of `bool`s only (a
    /// comparison of masks, a `where` between them), which any kernel computes as 0 and 1.
    elem_compute: HashMap<ValueId, Option<Compute>>,
    out: Vec<Instr>,
    /// Counters.
    pub stats: BuildStats,
}

/// What building a region did.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuildStats {
    /// `fused` instructions emitted.
    pub kernels: u64,
    /// Values computed inside kernels and never written to memory.
    pub elided: u64,
    /// Kernels that could not be built (the instruction was kept).
    pub fallbacks: u64,
    /// The e-graph.
    pub saturation: Saturation,
}

/// A kernel under construction.
struct Builder {
    /// The value the kernel computes.
    root: ValueId,
    /// How deep the emission is now (see [`MAX_DEPTH`]).
    depth: usize,
    space: Vec<usize>,
    nodes: Vec<Node>,
    memo: HashMap<Node, u32>,
    /// Expressions already emitted, by arena index and map: a DAG is walked once per use
    /// site, not as a tree (a loop-carried chain shares each step twice).
    emitted: HashMap<(usize, Map, Vec<usize>), u32>,
    inputs: Vec<(ValueId, Access)>,
    rows: Option<Vec<usize>>,
    /// The matmul whose product is `acc` (epilogue kernels).
    acc: Option<ValueId>,
    acc_used: usize,
    /// What the kernel computes in: the root's dtype's.
    compute: Compute,
}

impl Builder {
    fn new(root: ValueId, space: Vec<usize>, rows: Option<Vec<usize>>, compute: Compute) -> Builder {
        Builder {
            compute,
            root,
            depth: 0,
            space,
            nodes: Vec::new(),
            memo: HashMap::new(),
            emitted: HashMap::new(),
            inputs: Vec::new(),
            rows,
            acc: None,
            acc_used: 0,
        }
    }

    fn node(&mut self, n: Node) -> u32 {
        if let Some(&i) = self.memo.get(&n) {
            return i;
        }
        let i = self.nodes.len() as u32;
        self.nodes.push(n);
        self.memo.insert(n, i);
        i
    }

    fn input(&mut self, v: ValueId, access: Access) -> u32 {
        let i = match self.inputs.iter().position(|(w, a)| *w == v && *a == access) {
            Some(i) => i,
            None => {
                self.inputs.push((v, access));
                self.inputs.len() - 1
            }
        };
        self.node(Node::Input(i as u32))
    }
}

/// Why a value cannot be computed inside the kernel being built: it must be read from memory.
struct Materialise(ValueId);

impl<'a> Region<'a> {
    /// Builds the fused form of `instrs` (a region: no value defined twice, every value it
    /// names typed in `types`); the values it frees die in it, the others live on.
    pub fn build(
        instrs: Vec<Instr>,
        types: &'a HashMap<ValueId, TensorType>,
        fast_math: bool,
        limits: Limits,
    ) -> (Vec<Instr>, BuildStats) {
        let mut r = Region {
            types,
            defs: HashMap::new(),
            instrs: HashMap::new(),
            arena: Vec::new(),
            arena_value: HashMap::new(),
            uses: HashMap::new(),
            live_out: HashSet::new(),
            materialised: HashSet::new(),
            absorbed: HashSet::new(),
            visiting: HashSet::new(),
            elem_compute: HashMap::new(),
            out: Vec::new(),
            stats: BuildStats::default(),
        };
        if !defined_before_use(&instrs) {
            // Not a region the fuse pass makes: kept as it is rather than followed in circles.
            return (instrs, BuildStats::default());
        }
        let freed: HashSet<ValueId> =
            instrs.iter().filter_map(|i| if let Instr::Free { src } = i { Some(*src) } else { None }).collect();
        for i in &instrs {
            for v in i.operands() {
                if !matches!(i, Instr::Free { .. }) {
                    *r.uses.entry(v).or_default() += 1;
                }
            }
            for v in i.results() {
                if !freed.contains(&v) {
                    r.live_out.insert(v);
                }
            }
        }
        r.classify(&instrs, fast_math, limits);
        let mut frees = Vec::new();
        for instr in instrs {
            match &instr {
                Instr::Free { .. } => frees.push(instr),
                _ => {
                    let results = instr.results();
                    let opaque = results.first().is_none_or(|v| matches!(r.defs.get(v), Some(Def::Opaque) | None));
                    if opaque {
                        for v in instr.operands() {
                            r.materialise(v);
                        }
                        r.materialised.extend(results);
                        r.out.push(instr);
                    }
                }
            }
        }
        let mut live: Vec<ValueId> = r.live_out.iter().copied().collect();
        // By id, for a deterministic order (clients number values as they define them).
        live.sort_unstable();
        for v in live {
            r.materialise(v);
        }
        // Frees of values read by kernels go after every kernel of the region; a value fused
        // away never existed, and freeing it would be an error.
        r.stats.elided = r.defs.keys().filter(|v| !r.materialised.contains(v)).count() as u64;
        r.out.extend(frees.into_iter().filter(|f| match f {
            Instr::Free { src } => !r.defs.contains_key(src) || r.materialised.contains(src),
            _ => true,
        }));
        (r.out, r.stats)
    }

    fn dims(&self, v: ValueId) -> Vec<usize> {
        self.types.get(&v).map(|t| t.shape.0.to_vec()).unwrap_or_default()
    }

    fn dtype(&self, v: ValueId) -> Option<DType> {
        self.types.get(&v).map(|t| t.dtype)
    }

    /// What the elementwise `instr` computes in when a kernel can compute it there: every
    /// value it names loads into that type as the interpreter converts it (or is a `bool`,
    /// 0 and 1 in any type). `Some(None)` for an op on `bool`s only.
    fn elementwise_compute(&self, instr: &Instr) -> Option<Option<Compute>> {
        let dst = *instr.results().first()?;
        let result = self.dtype(dst)?;
        let values: Vec<DType> = instr.operands().iter().map(|&v| self.dtype(v)).collect::<Option<_>>()?;
        let scalars = match instr {
            Instr::Binary { lhs, rhs, .. } => [lhs, rhs].iter().filter(|o| matches!(o, Operand::Scalar(_))).count(),
            Instr::Where { on_true, on_false, .. } => {
                [on_true, on_false].iter().filter(|o| matches!(o, Operand::Scalar(_))).count()
            }
            _ => 0,
        };
        if scalars == 0 && result == DType::Bool && values.iter().all(|&d| d == DType::Bool) {
            return Some(None);
        }
        let computed = self.computed_dtype(instr)?;
        let compute = Compute::of(computed);
        // An op on halves rounds a wider operand (an `f32` 0-d tensor) to the half first, as
        // the eager op converts it: kept eager rather than read unrounded by a kernel.
        let wider = |d: DType| computed.is_half() && d.is_float() && d != computed;
        let fits =
            values.iter().chain([&result]).all(|&d| d == DType::Bool || (Compute::of(d) == compute && !wider(d)));
        fits.then_some(Some(compute))
    }

    /// The dtype an elementwise instruction computes in (its result's, or for a comparison
    /// its operands' promoted), by the type rules' own functions (as `kernel::lower` does).
    fn computed_dtype(&self, instr: &Instr) -> Option<DType> {
        match instr {
            Instr::Binary { op, lhs, rhs, .. } => {
                let ty = |v| self.types.get(&v).cloned().ok_or(gt_ir::TypeError::UnknownValue(v));
                let operands = elementwise(&[*lhs, *rhs], &ty).ok()?;
                binary_dtypes(*op, operands.dtype).ok().map(|(compute, _)| compute)
            }
            _ => self.dtype(*instr.results().first()?),
        }
    }

    /// What the instruction `instr` that is not elementwise computes in, when every value
    /// it names is stored in a dtype of that type and none is a `bool`.
    fn stored_compute(&self, instr: &Instr) -> Option<Compute> {
        let mut compute = None;
        for v in instr.results().into_iter().chain(instr.operands()) {
            let d = self.dtype(v).filter(|&d| d != DType::Bool)?;
            match compute {
                None => compute = Some(Compute::of(d)),
                Some(c) if c != Compute::of(d) => return None,
                Some(_) => {}
            }
        }
        compute
    }

    /// Whether a kernel computing in `compute` can read `v` from memory: a buffer of a dtype
    /// of that type (`f32` kernels: `f32`, `f16`, `bf16`, a chain of halves rounding once,
    /// where it is written, as PyTorch's compiler does; eager ops round at each step), or a
    /// `bool` (a mask), read as 0 and 1 in any type.
    fn kernel_reads(&self, v: ValueId, compute: Compute) -> bool {
        self.dtype(v).is_some_and(|d| d == DType::Bool || Compute::of(d) == compute)
    }

    /// Whether `v` is stored as a half (`f16`, `bf16`).
    fn half(&self, v: ValueId) -> bool {
        self.dtype(v).is_some_and(|d| d.is_half())
    }

    /// `value` as `v`'s dtype holds it.
    fn rounded(&self, v: ValueId, value: f64) -> f64 {
        self.dtype(v).map_or(value, |d| gt_ir::data::converted_scalar(d, value))
    }

    /// An elementwise instruction computing in `f64` or `i64` as arena nodes, as written:
    /// each operand a leaf (emitting it checks its own type), scalars converted to the
    /// dtype the op computes in, an `i32` result wrapped back.
    fn typed_expr(&mut self, instr: &Instr) -> usize {
        let dtype = self.computed_dtype(instr).unwrap_or(DType::F64);
        let add = |arena: &mut Vec<E>, e: E| {
            arena.push(e);
            arena.len() - 1
        };
        let operand = |arena: &mut Vec<E>, o: Operand| match o {
            Operand::Value(v) => add(arena, E::Leaf(v)),
            Operand::Scalar(x) => add(arena, E::Const64(gt_ir::data::converted_scalar(dtype, x).to_bits())),
        };
        let arena = &mut self.arena;
        let (e, wraps) = match *instr {
            Instr::Unary { op, src, .. } => (E::Unary(op, operand(arena, Operand::Value(src))), true),
            Instr::Binary { op, lhs, rhs, .. } => {
                (E::Binary(op, operand(arena, lhs), operand(arena, rhs)), !op.is_comparison())
            }
            Instr::Where { cond, on_true, on_false, .. } => {
                let c = operand(arena, Operand::Value(cond));
                (E::Select(c, operand(arena, on_true), operand(arena, on_false)), false)
            }
            _ => unreachable!("only elementwise instructions are typed expressions"),
        };
        let root = add(arena, e);
        let result = instr.results().first().and_then(|&v| self.dtype(v));
        let root = match result {
            Some(DType::I32) if wraps => add(&mut self.arena, E::Round(Storage::I32, root)),
            _ => root,
        };
        // Where a deep expression is cut (`emit_expr`).
        if let Some(&dst) = instr.results().first() {
            self.arena_value.entry(root).or_insert(dst);
        }
        root
    }

    /// Sorts each instruction into a [`Def`] and runs the e-graph over the elementwise ones.
    fn classify(&mut self, instrs: &[Instr], fast_math: bool, limits: Limits) {
        let mut egraph: egg::EGraph<Expr, Facts> = egg::EGraph::new(Facts::default());
        let mut leaves: Vec<ValueId> = Vec::new();
        let mut leaf_index: HashMap<ValueId, u32> = HashMap::new();
        let mut class: HashMap<ValueId, egg::Id> = HashMap::new();
        let mut elementwise: Vec<ValueId> = Vec::new();
        for instr in instrs {
            let Some(&dst) = instr.results().first() else { continue };
            // Comparisons' bools are 0 and 1 inside kernels, halves are widened to f32 as
            // read; f64 and integer expressions stay out of the e-graph.
            let is_elementwise = matches!(instr, Instr::Unary { .. } | Instr::Binary { .. } | Instr::Where { .. });
            let stored = self.stored_compute(instr);
            let def = match instr {
                _ if is_elementwise => match self.elementwise_compute(instr) {
                    None => Def::Opaque,
                    Some(Some(compute)) if compute != Compute::F32 => {
                        self.elem_compute.insert(dst, Some(compute));
                        Def::Elem(self.typed_expr(instr))
                    }
                    Some(compute) => {
                        // An op on `bool`s only computes in any type, but its expression
                        // looks into its operands': over a comparison computed in `f32`
                        // (`exp(mask) >= 2`) it computes in `f32` too, so that an `i64`
                        // kernel reads it rather than recomputing `f32` ops as integers.
                        let looks_into_f32 = instr
                            .operands()
                            .iter()
                            .any(|v| class.contains_key(v) && self.elem_compute.get(v) == Some(&Some(Compute::F32)));
                        let compute = if looks_into_f32 { Some(Compute::F32) } else { compute };
                        self.elem_compute.insert(dst, compute);
                        // A scalar as the op's dtype holds it, as the eager op converts it
                        // (`h - 1.0001` of an `f16` subtracts 1).
                        // (`binary_scalar`: a half's `mul`/`div` by a scalar keeps it in `f32`).
                        let scalar_dtype = self.computed_dtype(instr).unwrap_or(DType::F32);
                        let binary_op = match instr {
                            Instr::Binary { op, .. } => Some(*op),
                            _ => None,
                        };
                        let mut operand = |o: Operand, rhs: bool, egraph: &mut egg::EGraph<Expr, Facts>| match o {
                            Operand::Scalar(x) => {
                                let x = match binary_op {
                                    Some(op) => gt_ir::data::binary_scalar(op, scalar_dtype, x, rhs),
                                    None => gt_ir::data::converted_scalar(scalar_dtype, x),
                                } as f32;
                                egraph.add(Expr::Const(egraph::Scalar(x.to_bits())))
                            }
                            // Elementwise operands are looked into, broadcast ones too: a
                            // kernel recomputes them rather than reading them from memory.
                            Operand::Value(v) if class.contains_key(&v) => class[&v],
                            Operand::Value(v) => {
                                let n = *leaf_index.entry(v).or_insert_with(|| {
                                    leaves.push(v);
                                    (leaves.len() - 1) as u32
                                });
                                let numel = self.types.get(&v).map_or(1.0, |t| t.shape.numel() as f64);
                                let table = &mut egraph.analysis.leaf_numel;
                                if table.len() <= n as usize {
                                    table.resize(n as usize + 1, 1.0);
                                }
                                table[n as usize] = numel;
                                egraph.add(Expr::Leaf(egraph::Leaf(n)))
                            }
                        };
                        let node = match instr {
                            Instr::Unary { op, src, .. } => {
                                let a = operand(Operand::Value(*src), false, &mut egraph);
                                egraph::add_unary(&mut egraph, *op, a)
                            }
                            Instr::Binary { op, lhs, rhs, .. } => {
                                let (a, b) = (operand(*lhs, false, &mut egraph), operand(*rhs, true, &mut egraph));
                                egraph::add_binary(&mut egraph, *op, a, b)
                            }
                            Instr::Where { cond, on_true, on_false, .. } => {
                                let c = operand(Operand::Value(*cond), false, &mut egraph);
                                let (t, f) =
                                    (operand(*on_true, false, &mut egraph), operand(*on_false, true, &mut egraph));
                                egraph.add(Expr::Select([c, t, f]))
                            }
                            _ => unreachable!("matched above"),
                        };
                        class.insert(dst, node);
                        elementwise.push(dst);
                        Def::Elem(usize::MAX)
                    }
                },
                // A view of a `bool` (a mask broadcast over heads) is read through, as 0 and 1.
                _ if stored.is_none() => match view_source(instr) {
                    Some(src) if self.dtype(dst) == Some(DType::Bool) => Def::View { src },
                    _ => Def::Opaque,
                },
                // Products and values made from indices compute in f32 only; reductions in
                // any type, over rows that are not empty (an empty row's integer max is its
                // dtype's least value, which an i64 kernel does not know).
                Instr::MatMul { .. } | Instr::Rand { .. } | Instr::Randn { .. } | Instr::Arange { .. }
                    if stored != Some(Compute::F32) =>
                {
                    Def::Opaque
                }
                Instr::Reduce { src, .. } if stored != Some(Compute::F32) && self.dims(*src).contains(&0) => {
                    Def::Opaque
                }
                Instr::Reduce { op, src, axes, keepdim, .. } => {
                    let rank = self.dims(*src).len();
                    let axes = match axes {
                        None => Some((0..rank).collect::<Vec<_>>()),
                        Some(a) => normalize_axes(a, rank).ok().map(|mut a| {
                            a.sort_unstable();
                            a
                        }),
                    };
                    match axes {
                        Some(axes) if !axes.is_empty() => Def::Reduce { op: *op, src: *src, axes, keepdim: *keepdim },
                        _ => Def::Opaque,
                    }
                }
                Instr::MatMul { lhs, rhs, .. } if self.dims(*lhs).len() >= 2 && self.dims(*rhs).len() >= 2 => {
                    Def::MatMul { lhs: *lhs, rhs: *rhs }
                }
                Instr::Reshape { src, .. } => Def::Reshape { src: *src },
                Instr::Zeros { .. } => Def::Constant(0.0),
                Instr::Ones { .. } => Def::Constant(1.0),
                // What the value holds: a half's constant rounded, and values made from
                // indices (random, ranges) of halves made in memory, rounded, not recomputed
                // in f32 by each kernel that reads them.
                Instr::Full { value, .. } => Def::Constant(self.rounded(dst, *value)),
                Instr::Rand { .. } | Instr::Randn { .. } | Instr::Arange { .. } if self.half(dst) => Def::Opaque,
                Instr::Rand { seed, .. } => Def::Indexed(Node::Rand { seed: *seed }),
                Instr::Randn { seed, .. } => Def::Indexed(Node::Randn { seed: *seed }),
                Instr::Arange { start, step, .. } => {
                    Def::Indexed(Node::Iota { start: start.to_bits(), step: step.to_bits() })
                }
                _ => view_source(instr).map_or(Def::Opaque, |src| Def::View { src }),
            };
            if instr.results().len() == 1 {
                self.defs.insert(dst, def);
                self.instrs.insert(dst, instr.clone());
            } else {
                for v in instr.results() {
                    self.defs.insert(v, Def::Opaque);
                }
            }
        }
        if elementwise.is_empty() {
            return;
        }
        let roots: Vec<egg::Id> = elementwise.iter().map(|v| class[v]).collect();
        let (exprs, saturation) = egraph::simplify(egraph, &roots, fast_math, limits);
        self.stats.saturation = saturation;
        let mut memo: HashMap<E, usize> = HashMap::new();
        for (v, expr) in elementwise.iter().zip(exprs) {
            let mut ids: Vec<usize> = Vec::with_capacity(expr.as_ref().len());
            for enode in expr.as_ref() {
                let e = match enode.op() {
                    Op::Leaf(n) => E::Leaf(leaves[n as usize]),
                    Op::Const(c) => E::Const(c.to_bits()),
                    Op::Unary(op, a) => E::Unary(op, ids[usize::from(a)]),
                    Op::Binary(op, a, b) => E::Binary(op, ids[usize::from(a)], ids[usize::from(b)]),
                    Op::Select(c, t, f) => E::Select(ids[usize::from(c)], ids[usize::from(t)], ids[usize::from(f)]),
                };
                let arena = &mut self.arena;
                let id = *memo.entry(e).or_insert_with(|| {
                    arena.push(e);
                    arena.len() - 1
                });
                ids.push(id);
            }
            let root = ids.last().copied().unwrap_or(0);
            self.defs.insert(*v, Def::Elem(root));
            self.arena_value.entry(root).or_insert(*v);
        }
    }

    /// Makes `v` exist in memory (emitting its kernel, or its own instruction).
    fn materialise(&mut self, v: ValueId) {
        // An absorbed matmul that another kernel needs after all gets its own kernel too.
        if !self.defs.contains_key(&v) || self.materialised.contains(&v) || !self.visiting.insert(v) {
            return;
        }
        // A `bool` a kernel computes (a comparison, a mask) is written as kernels write
        // `.to(bool)`; a view of one stays its instruction.
        let writable =
            self.dtype(v).is_some_and(|d| d != DType::Bool || matches!(self.defs.get(&v), Some(Def::Elem(_))));
        let kernel = if writable { self.kernel(v) } else { None };
        match kernel {
            Some((kernel, srcs)) => {
                let ty = self.types[&v].clone();
                self.out.push(Instr::Fused { dst: v, ty, srcs, kernel: Box::new(kernel) });
                self.stats.kernels += 1;
            }
            None => {
                // Unfused: the original instruction, its operands materialised first.
                if let Some(instr) = self.instrs.get(&v).cloned() {
                    for o in instr.operands() {
                        self.materialise(o);
                    }
                    self.out.push(instr);
                    self.stats.fallbacks += u64::from(writable);
                }
            }
        }
        self.visiting.remove(&v);
        self.materialised.insert(v);
    }

    /// The kernel computing `v` and its input values, materialising what it reads.
    fn kernel(&mut self, v: ValueId) -> Option<(Kernel, Vec<ValueId>)> {
        // Building may discover values that must be read from memory: materialise each and
        // try again (each retry has one more leaf, so this ends).
        for _ in 0..64 {
            match self.try_kernel(v) {
                Ok(Some((kernel, srcs, absorbed))) => {
                    if let Some(p) = absorbed {
                        self.absorbed.insert(p);
                    }
                    return Some((kernel, srcs));
                }
                Ok(None) => return None,
                Err(Materialise(w)) if w != v && !self.materialised.contains(&w) && !self.visiting.contains(&w) => {
                    self.materialise(w);
                    if !self.materialised.contains(&w) {
                        return None;
                    }
                }
                Err(_) => return None,
            }
        }
        None
    }

    /// The kernel of `v`, its inputs, and the matmul it absorbed as its epilogue's product.
    #[allow(clippy::type_complexity)]
    fn try_kernel(&mut self, v: ValueId) -> Result<Option<(Kernel, Vec<ValueId>, Option<ValueId>)>, Materialise> {
        let dims = self.dims(v);
        let def = self.defs[&v].clone();
        let mut absorbed = None;
        let (kernel, inputs) = match def {
            Def::Opaque => return Ok(None),
            Def::Reduce { op, src, axes, keepdim } => {
                let space = self.dims(src);
                let kept: usize = (0..space.len()).filter(|a| !axes.contains(a)).map(|a| space[a]).product();
                let row: usize = axes.iter().map(|&a| space[a]).product();
                // A few (but more than one) long rows reduce faster as a separate two-pass
                // reduction on GPUs; a full reduction is split in two passes when lowered.
                if kept > 1 && kept < 64 && row >= 1 << 16 {
                    return Ok(None);
                }
                let compute = self.dtype(v).map_or(Compute::F32, Compute::of);
                let mut b = Builder::new(v, space.clone(), Some(axes.clone()), compute);
                self.emit(&mut b, src, &Map::identity(space.len()))?;
                // The output walks the kept axes row-major; reduced axes do not move it.
                let kept_dims: Vec<usize> = if keepdim {
                    space.iter().enumerate().map(|(a, &d)| if axes.contains(&a) { 1 } else { d }).collect()
                } else {
                    (0..space.len()).filter(|a| !axes.contains(a)).map(|a| space[a]).collect()
                };
                let rm = row_major_strides(&kept_dims);
                let mut next = rm.iter();
                let strides = (0..space.len())
                    .map(|a| {
                        if axes.contains(&a) {
                            if keepdim {
                                next.next();
                            }
                            0
                        } else {
                            *next.next().unwrap_or(&0)
                        }
                    })
                    .collect();
                let kernel = MapKernel {
                    shape: space,
                    inputs: b.inputs.iter().map(|(_, a)| a.clone()).collect(),
                    nodes: b.nodes,
                    output: Access { offset: 0, strides },
                    rows: axes,
                    reduce: Some(op),
                    compute,
                };
                (Kernel::Map(kernel), b.inputs.into_iter().map(|(v, _)| v).collect::<Vec<_>>())
            }
            Def::MatMul { lhs, rhs } => self.matmul(v, lhs, rhs, &dims, None)?,
            Def::Elem(root) => {
                if let Some(p) = self.epilogue_candidate(v, root) {
                    if let Def::MatMul { lhs, rhs } = self.defs[&p].clone() {
                        match self.matmul(p, lhs, rhs, &dims, Some(root)) {
                            Ok(k) => {
                                absorbed = Some(p);
                                k
                            }
                            Err(Materialise(w)) if w == p => self.map_kernel(v, &dims)?,
                            Err(e) => return Err(e),
                        }
                    } else {
                        self.map_kernel(v, &dims)?
                    }
                } else {
                    self.map_kernel(v, &dims)?
                }
            }
            _ => self.map_kernel(v, &dims)?,
        };
        Ok(self.check(v, kernel, inputs).map(|(k, i)| (k, i, absorbed)))
    }

    /// Keeps a kernel only if it provably fits its buffers and writes its whole result.
    fn check(&mut self, v: ValueId, kernel: Kernel, inputs: Vec<ValueId>) -> Option<(Kernel, Vec<ValueId>)> {
        let lens: Vec<usize> = inputs.iter().map(|i| self.types.get(i).map_or(0, |t| t.shape.numel())).collect();
        let out = self.types[&v].shape.numel();
        if kernel.check_bounds(&lens, out).and_then(|()| kernel.check_covers(out)).is_err() {
            return None;
        }
        Some((kernel, inputs))
    }

    fn map_kernel(&mut self, v: ValueId, dims: &[usize]) -> Result<(Kernel, Vec<ValueId>), Materialise> {
        // What the root computes in (a comparison: its operands' type, its `bool` stored).
        let compute = match self.elem_compute.get(&v) {
            Some(Some(c)) => *c,
            _ => self.dtype(v).map_or(Compute::F32, Compute::of),
        };
        let mut b = Builder::new(v, dims.to_vec(), None, compute);
        self.emit_value(&mut b, v, &Map::identity(dims.len()), true)?;
        let rows = b.rows.clone().unwrap_or_default();
        let kernel = MapKernel {
            shape: dims.to_vec(),
            inputs: b.inputs.iter().map(|(_, a)| a.clone()).collect(),
            nodes: b.nodes,
            output: Access::contiguous(dims),
            rows,
            reduce: None,
            compute,
        };
        Ok((Kernel::Map(kernel), b.inputs.into_iter().map(|(v, _)| v).collect()))
    }

    /// A matmul `p` that `v`'s expression reads once, at the same shape, and nothing else
    /// reads: it can be computed in `v`'s kernel with `v`'s expression as its epilogue.
    fn epilogue_candidate(&self, v: ValueId, root: usize) -> Option<ValueId> {
        let dims = self.dims(v);
        let mut found = None;
        let mut count = 0;
        let mut stack = vec![root];
        // The arena is a DAG (a loop-carried chain shares each step twice): visit each node
        // once, so the walk is linear, and count distinct matmuls.
        let mut seen = HashSet::new();
        while let Some(e) = stack.pop() {
            if !seen.insert(e) {
                continue;
            }
            match self.arena[e] {
                E::Leaf(p) => {
                    if matches!(self.defs.get(&p), Some(Def::MatMul { .. })) {
                        count += 1;
                        found = Some(p);
                    }
                }
                E::Const(_) | E::Const64(_) => {}
                E::Unary(_, a) | E::Round(_, a) => stack.push(a),
                E::Binary(_, a, b) => stack.extend([a, b]),
                E::Select(c, t, f) => stack.extend([c, t, f]),
            }
        }
        let p = found?;
        let single = count == 1
            && self.uses.get(&p) == Some(&1)
            && !self.live_out.contains(&p)
            && !self.materialised.contains(&p)
            && self.dims(p) == dims;
        single.then_some(p)
    }

    /// The matmul kernel of `p = lhs @ rhs`, with the expression `epilogue` (of shape
    /// `dims`) applied to each product element when given.
    fn matmul(
        &mut self,
        p: ValueId,
        lhs: ValueId,
        rhs: ValueId,
        dims: &[usize],
        epilogue: Option<usize>,
    ) -> Result<(Kernel, Vec<ValueId>), Materialise> {
        let (ld, rd, pd) = (self.dims(lhs), self.dims(rhs), self.dims(p));
        let rank = pd.len();
        let (m, n, k) = (pd[rank - 2], pd[rank - 1], ld[ld.len() - 1]);
        let batch = pd[..rank - 2].to_vec();
        // Iteration coordinates of an operand: [batch.., rows, cols].
        let space = |r: usize, c: usize| batch.iter().copied().chain([r, c]).collect::<Vec<_>>();
        let operand = |this: &mut Region, v: ValueId, d: &[usize], r: usize, c: usize| {
            let full = space(r, c);
            let map = Map::identity(full.len()).broadcast(&full, d);
            this.leaf_access(v, &map)
        };
        let ((lbase, la), (rbase, ra)) = (operand(self, lhs, &ld, m, k)?, operand(self, rhs, &rd, k, n)?);
        let mut srcs = vec![lbase, rbase];
        let mut kernel = MatMulKernel {
            batch: batch.clone(),
            m,
            n,
            k,
            lhs: la,
            rhs: ra,
            epilogue: Vec::new(),
            epilogue_inputs: Vec::new(),
            precision: Precision::F32,
        };
        if let Some(root) = epilogue {
            let mut b = Builder::new(p, dims.to_vec(), None, Compute::F32);
            b.acc = Some(p);
            self.emit_expr(&mut b, root, dims, &Map::identity(dims.len()))?;
            if b.acc_used != 1 || b.rows.is_some() {
                return Err(Materialise(p));
            }
            kernel.epilogue = b.nodes;
            for (v, a) in b.inputs {
                srcs.push(v);
                kernel.epilogue_inputs.push(a);
            }
        }
        Ok((Kernel::MatMul(kernel), srcs))
    }

    /// The buffer holding `v` and its access under `map` (views and reshapes of memory are
    /// strided reads of the underlying buffer).
    fn leaf_access(&mut self, mut v: ValueId, map: &Map) -> Result<(ValueId, Access), Materialise> {
        let mut map = map.clone();
        // A loop, not recursion: a chain of views is as long as the region.
        loop {
            match self.defs.get(&v).cloned() {
                _ if self.is_memory(v) && !self.kernel_reads(v, Compute::F32) => return Err(Materialise(v)),
                _ if self.is_memory(v) => return Ok((v, map.access(&self.dims(v)))),
                Some(Def::View { src }) => {
                    map = self.view_map(v, src, &map).ok_or(Materialise(v))?;
                    v = src;
                }
                Some(Def::Reshape { src }) if self.is_memory(src) => return Ok((src, map.access(&self.dims(v)))),
                _ => return Err(Materialise(v)),
            }
        }
    }

    /// Whether `v` is a contiguous buffer already (a region input or materialised).
    fn is_memory(&self, v: ValueId) -> bool {
        !self.defs.contains_key(&v) || self.materialised.contains(&v)
    }

    /// Emits the nodes computing `v` at the kernel's iteration point under `map`.
    fn emit(&mut self, b: &mut Builder, v: ValueId, map: &Map) -> Result<u32, Materialise> {
        self.emit_value(b, v, map, false)
    }

    fn emit_value(&mut self, b: &mut Builder, v: ValueId, map: &Map, root: bool) -> Result<u32, Materialise> {
        if b.acc == Some(v) {
            if *map != Map::identity(b.space.len()) {
                return Err(Materialise(v));
            }
            b.acc_used += 1;
            return Ok(b.node(Node::Acc));
        }
        // A `bool` in memory (its kernel's or instruction's) is recomputed from its
        // expression where it has one in the kernel's type, as the e-graph's expressions look
        // into their operands; one computed in another type is read.
        let recomputed = self.dtype(v) == Some(DType::Bool)
            && matches!(self.defs.get(&v), Some(Def::Elem(_)))
            && self.elem_compute.get(&v).is_some_and(|c| c.is_none_or(|c| c == b.compute));
        if self.is_memory(v) && !recomputed {
            if !self.kernel_reads(v, b.compute) {
                return Err(Materialise(v));
            }
            let access = map.access(&self.dims(v));
            return Ok(b.input(v, access));
        }
        if b.depth >= MAX_DEPTH {
            return Err(Materialise(v));
        }
        b.depth += 1;
        let n = self.emit_defined(b, v, map, root);
        b.depth -= 1;
        n
    }

    /// [`Region::emit_value`] for a value the region computes.
    fn emit_defined(&mut self, b: &mut Builder, v: ValueId, map: &Map, root: bool) -> Result<u32, Materialise> {
        let dims = self.dims(v);
        // A value computed in another type than the kernel's is read from memory.
        let other_type = match self.elem_compute.get(&v) {
            Some(compute) => compute.is_some_and(|c| c != b.compute),
            None => !self.kernel_reads(v, b.compute),
        };
        if other_type {
            return Err(Materialise(v));
        }
        match self.defs[&v].clone() {
            Def::Elem(e) => {
                if !root && map.repeats(&b.space) && self.expensive(e) {
                    return Err(Materialise(v));
                }
                self.emit_expr(b, e, &dims, map)
            }
            Def::Constant(c) if b.compute == Compute::F32 => Ok(b.node(Node::constant(c as f32))),
            Def::Constant(c) => Ok(b.node(Node::Const64(c.to_bits()))),
            Def::Indexed(node) => {
                // A `randn` costs a logarithm and a cosine per element: a row kernel, which
                // would compute it again on each pass over its rows (softmax's three), reads
                // it from a kernel of its own.
                let costly = !root && matches!(node, Node::Randn { .. }) && b.rows.is_some();
                if !costly && dims == b.space && *map == Map::identity(dims.len()) && b.acc.is_none() {
                    Ok(b.node(node))
                } else {
                    Err(Materialise(v))
                }
            }
            Def::View { src } => {
                let m = self.view_map(v, src, map).ok_or(Materialise(v))?;
                self.emit(b, src, &m)
            }
            Def::Reshape { src } => {
                if self.is_memory(src) && self.kernel_reads(src, b.compute) {
                    Ok(b.input(src, map.access(&dims)))
                } else {
                    Err(Materialise(src))
                }
            }
            Def::Reduce { op, src, axes, keepdim } if !root => self.in_row(b, v, op, src, &axes, keepdim, map),
            _ => Err(Materialise(v)),
        }
    }

    /// Whether recomputing an expression per element of a broadcast costs more than reading
    /// it (it has a transcendental op or is long).
    fn expensive(&self, root: usize) -> bool {
        let mut stack = vec![root];
        let mut count = 0;
        while let Some(e) = stack.pop() {
            count += 1;
            match self.arena[e] {
                E::Unary(op, a) => {
                    if !matches!(op, gt_ir::UnaryOp::Neg | gt_ir::UnaryOp::Abs | gt_ir::UnaryOp::Relu) {
                        return true;
                    }
                    stack.push(a)
                }
                E::Binary(_, a, c) => stack.extend([a, c]),
                E::Select(c, t, f) => stack.extend([c, t, f]),
                E::Round(_, a) => stack.push(a),
                // An `f64` or integer expression names the values it reads: those computed
                // here are recomputed with it.
                E::Leaf(v) if !self.is_memory(v) => {
                    if let Some(&Def::Elem(e)) = self.defs.get(&v) {
                        stack.push(e);
                    }
                }
                _ => {}
            }
            if count > 8 {
                return true;
            }
        }
        false
    }

    fn emit_expr(&mut self, b: &mut Builder, e: usize, dims: &[usize], map: &Map) -> Result<u32, Materialise> {
        let key = (e, map.clone(), dims.to_vec());
        if let Some(&n) = b.emitted.get(&key) {
            return Ok(n);
        }
        if b.depth >= MAX_DEPTH {
            // Deep in one value's expression (a chain of elementwise ops): cut at the value
            // this node computes (or reads, for an `f64` or integer expression's operand), or
            // build no kernel for the root.
            let cut = match self.arena[e] {
                E::Leaf(v) if !self.is_memory(v) => Some(v),
                _ => self.arena_value.get(&e).copied(),
            };
            return Err(Materialise(cut.unwrap_or(b.root)));
        }
        b.depth += 1;
        let n = self.emit_expr_uncached(b, e, dims, map);
        b.depth -= 1;
        let n = n?;
        b.emitted.insert(key, n);
        Ok(n)
    }

    fn emit_expr_uncached(&mut self, b: &mut Builder, e: usize, dims: &[usize], map: &Map) -> Result<u32, Materialise> {
        Ok(match self.arena[e] {
            E::Leaf(v) => {
                let m = map.broadcast(dims, &self.dims(v));
                self.emit(b, v, &m)?
            }
            E::Const(bits) => b.node(Node::Const(bits)),
            E::Const64(bits) => b.node(Node::Const64(bits)),
            E::Round(storage, a) => {
                let a = self.emit_expr(b, a, dims, map)?;
                b.node(Node::Round(storage, a))
            }
            E::Unary(op, a) => {
                let a = self.emit_expr(b, a, dims, map)?;
                b.node(Node::Unary(op, a))
            }
            E::Binary(op, x, y) => {
                let x = self.emit_expr(b, x, dims, map)?;
                let y = self.emit_expr(b, y, dims, map)?;
                b.node(Node::Binary(op, x, y))
            }
            E::Select(c, t, f) => {
                let c = self.emit_expr(b, c, dims, map)?;
                let t = self.emit_expr(b, t, dims, map)?;
                let f = self.emit_expr(b, f, dims, map)?;
                b.node(Node::Select(c, t, f))
            }
        })
    }

    /// `v = reduce(src)` read under `map` as an in-row reduction of the kernel: possible
    /// when `map` broadcasts `v` along exactly the kernel's row axes, which are the reduced
    /// axes of `src` (right-aligned with the kernel's space).
    #[allow(clippy::too_many_arguments)]
    fn in_row(
        &mut self,
        b: &mut Builder,
        v: ValueId,
        op: ReduceOp,
        src: ValueId,
        axes: &[usize],
        keepdim: bool,
        map: &Map,
    ) -> Result<u32, Materialise> {
        if b.acc.is_some() {
            return Err(Materialise(v));
        }
        let sd = self.dims(src);
        let cols = b.space.len();
        // The map in keepdim coordinates (one row per axis of `src`).
        let mut rows_k = Vec::with_capacity(sd.len());
        let mut next = 0;
        for a in 0..sd.len() {
            if axes.contains(&a) {
                if keepdim {
                    let r = map.row(next);
                    next += 1;
                    if r.0 != 0 || r.1.iter().any(|&c| c != 0) {
                        return Err(Materialise(v));
                    }
                }
                rows_k.push(map.zero_row());
            } else {
                rows_k.push(map.row(next));
                next += 1;
            }
        }
        let shift = cols.checked_sub(sd.len()).ok_or(Materialise(v))?;
        let mut row_axes = Vec::new();
        for &a in axes {
            if sd[a] == 1 {
                continue;
            }
            let j = a + shift;
            if b.space[j] != sd[a] || rows_k.iter().any(|r| r.1[j] != 0) {
                return Err(Materialise(v));
            }
            rows_k[a] = (0, (0..cols).map(|c| i64::from(c == j)).collect());
            row_axes.push(j);
        }
        // Every other axis of the space with size > 1 must not be a row axis of the kernel.
        match &b.rows {
            Some(r) if *r != row_axes => return Err(Materialise(v)),
            Some(_) => {}
            None => {
                if row_axes.is_empty() {
                    return Err(Materialise(v));
                }
                b.rows = Some(row_axes.clone())
            }
        }
        let src_map = Map::from_rows(rows_k, cols);
        // The kept coordinates of `src` must not move within a row.
        let kept_move =
            (0..sd.len()).filter(|a| !axes.contains(a)).any(|a| row_axes.iter().any(|&j| src_map.coef[a][j] != 0));
        if kept_move {
            return Err(Materialise(v));
        }
        let x = self.emit(b, src, &src_map)?;
        Ok(b.node(Node::Reduce(op, x)))
    }

    /// The map to `src`'s coordinates of view `v` read under `map`.
    fn view_map(&self, v: ValueId, src: ValueId, map: &Map) -> Option<Map> {
        let sd = self.dims(src);
        let vd = self.dims(v);
        let cols = map.cols;
        let instr = self.instrs.get(&v)?;
        let rows: Vec<(i64, Vec<i64>)> = match instr {
            Instr::Transpose { dim0, dim1, .. } => {
                let mut perm: Vec<usize> = (0..sd.len()).collect();
                perm.swap(normalize_axis(*dim0, sd.len()).ok()?, normalize_axis(*dim1, sd.len()).ok()?);
                permuted(map, &perm)
            }
            Instr::Permute { perm, .. } => {
                let perm = perm.iter().map(|&p| normalize_axis(p, sd.len())).collect::<Result<Vec<usize>, _>>().ok()?;
                permuted(map, &perm)
            }
            Instr::Unsqueeze { axis, .. } => {
                let a = normalize_axis(*axis, vd.len()).ok()?;
                (0..vd.len()).filter(|&i| i != a).map(|i| map.row(i)).collect()
            }
            Instr::Squeeze { axes, .. } => {
                let removed: Vec<usize> = match axes {
                    None => (0..sd.len()).filter(|&a| sd[a] == 1).collect(),
                    Some(a) => normalize_axes(a, sd.len()).ok()?,
                };
                let mut next = 0;
                (0..sd.len())
                    .map(|a| {
                        if removed.contains(&a) && sd[a] == 1 {
                            map.zero_row()
                        } else {
                            next += 1;
                            map.row(next - 1)
                        }
                    })
                    .collect()
            }
            Instr::BroadcastTo { .. } => return Some(map.broadcast(&vd, &sd)),
            Instr::Slice { index, .. } => {
                let resolved = resolve_slice(index, &Shape::from(&sd[..])).ok()?;
                // The view's axes of size > 1 are the taken axes of size > 1, in order.
                let mut moving = (0..vd.len()).filter(|&i| vd[i] != 1);
                resolved
                    .axes
                    .iter()
                    .map(|a| {
                        let start = a.start as i64;
                        if a.len == 1 {
                            (start, vec![0; cols])
                        } else {
                            let (o, c) = moving.next().map_or_else(|| map.zero_row(), |i| map.row(i));
                            (start + a.step * o, c.iter().map(|x| x * a.step).collect())
                        }
                    })
                    .collect()
            }
            _ => return None,
        };
        (rows.len() == sd.len()).then(|| Map::from_rows(rows, cols))
    }
}

/// Rows of the source of a permute: result axis `i` is source axis `perm[i]`.
fn permuted(map: &Map, perm: &[usize]) -> Vec<(i64, Vec<i64>)> {
    let mut rows = vec![map.zero_row(); perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        if p < rows.len() && i < map.offset.len() {
            rows[p] = map.row(i);
        }
    }
    rows
}

/// The value `instr` views, if it is a view a kernel reads through (strided).
fn view_source(instr: &Instr) -> Option<ValueId> {
    match instr {
        Instr::Transpose { src, .. }
        | Instr::Permute { src, .. }
        | Instr::Squeeze { src, .. }
        | Instr::Unsqueeze { src, .. }
        | Instr::BroadcastTo { src, .. }
        | Instr::Slice { src, .. } => Some(*src),
        _ => None,
    }
}

/// Whether every value the region defines is defined once, after nothing in the region read or
/// freed an older value of the same id, and not from itself: then its dataflow is acyclic and
/// the partitioner's walks end.
fn defined_before_use(instrs: &[Instr]) -> bool {
    let mut seen: HashSet<ValueId> = HashSet::new();
    for i in instrs {
        let operands = i.operands();
        if i.results().iter().any(|r| seen.contains(r) || operands.contains(r)) {
            return false;
        }
        seen.extend(operands);
        seen.extend(i.results());
    }
    true
}
