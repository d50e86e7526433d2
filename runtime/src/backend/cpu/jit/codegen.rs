//! Map kernels to CLIF: one function `fn(inputs: *const *const f32, out: *mut f32)` per
//! kernel, with every shape, stride and offset baked in as a constant (the kernel is the
//! cache key). Matmul epilogues come here too, as maps that read the product in place.
//! The arithmetic of one element is in `math.rs`.
//!
//! # Shape of the generated code
//!
//! The iteration space splits into the *kept* axes (one row each; every axis of a plain
//! map is a row axis of one single row) and the *row* axes. Each side is simplified first:
//! size-1 axes are dropped, and neighbours that every buffer walks as one (stride of the
//! outer = stride of the inner times its length) are merged, so a contiguous tensor of any
//! rank is one long axis. Then, for every row (nested loops over the kept axes, each
//! buffer's offset carried along), one *pass* runs over the row per in-row reduction the
//! result needs, in node order, computing only the nodes that reduction needs (values
//! before it are recomputed by later passes, never stored), and a final pass writes every
//! element or reduces the last node into one value per row. One exception: when the final
//! pass writes every element of the row, the last reduction pass stores its costliest value
//! the final pass also needs (softmax's `exp`) in the output element, and the final pass
//! loads it from there instead of recomputing it (`Plan::reuse`).
//!
//! A pass is nested loops over the row axes; the innermost axis runs four elements at a
//! time (`f32x4`) when every buffer it touches is contiguous (stride 1) or broadcast
//! (stride 0) along it, then a scalar tail; otherwise it is one element at a time at any
//! stride. Values that do not change along the innermost axis (constants, broadcast
//! inputs, earlier reductions, and anything computed only from those) are computed once
//! before that loop. Sums and means accumulate in `f64` (two `f64x2` accumulators in the
//! vector loop), as the interpreter does, so they differ from it only by summation order.

use super::math::{needs_powf, Emit, Lanes};
use super::wide::{self, Wide};
use super::JitError;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::immediates::Ieee32;
use cranelift_codegen::ir::{
    types, AbiParam, Block, ConstantData, Endianness, ExtFuncData, ExternalName, FuncRef, Function, InstBuilder,
    MemFlagsData, Signature, Type, UserExternalName, UserFuncName, Value,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use gt_ir::kernel::{Access, BufferStorage, Compute, MapKernel, MatMulKernel, Node, Storage};
use gt_ir::ReduceOp;

/// A Rust function the generated code calls, imported under user name `u0:<index>` (the
/// JIT module declares them first, in this order, so the indices are their function ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shim {
    /// `uniform(seed: u64, i: u64) -> f32`.
    Uniform = 0,
    /// `normal(seed: u64, i: u64) -> f32`.
    Normal = 1,
    /// `powf(x: f32, y: f32) -> f32`.
    Powf = 2,
    /// `binary_f64(op: i64, x: f64, y: f64) -> f64` (`wide.rs`: `pow`).
    BinaryF64 = 3,
    /// `unary_i64(op: i64, x: i64) -> i64`.
    UnaryI64 = 4,
    /// `binary_i64(op: i64, x: i64, y: i64) -> i64`.
    BinaryI64 = 5,
}

impl Shim {
    /// Every shim, in declaration order.
    pub const ALL: [Shim; 6] =
        [Shim::Uniform, Shim::Normal, Shim::Powf, Shim::BinaryF64, Shim::UnaryI64, Shim::BinaryI64];

    /// The symbol the JIT module resolves.
    pub fn symbol(self) -> &'static str {
        match self {
            Shim::Uniform => "gt_jit_uniform",
            Shim::Normal => "gt_jit_normal",
            Shim::Powf => "gt_jit_powf",
            Shim::BinaryF64 => "gt_jit_binary_f64",
            Shim::UnaryI64 => "gt_jit_unary_i64",
            Shim::BinaryI64 => "gt_jit_binary_i64",
        }
    }

    /// The shim's signature.
    pub fn signature(self, call_conv: CallConv) -> Signature {
        let mut sig = Signature::new(call_conv);
        let (params, result): (&[Type], Type) = match self {
            Shim::Uniform | Shim::Normal => (&[types::I64, types::I64], types::F32),
            Shim::Powf => (&[types::F32, types::F32], types::F32),
            Shim::BinaryF64 => (&[types::I64, types::F64, types::F64], types::F64),
            Shim::UnaryI64 => (&[types::I64, types::I64], types::I64),
            Shim::BinaryI64 => (&[types::I64, types::I64, types::I64], types::I64),
        };
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.push(AbiParam::new(result));
        sig
    }
}

/// What the generated code is for: calling convention and pointer size.
#[derive(Clone, Copy)]
pub(super) struct Target {
    pub frontend: TargetFrontendConfig,
    /// The host has fused multiply-add (polynomials use it: fewer instructions, and one
    /// rounding instead of two, in every lane alike).
    pub fma: bool,
}

impl Target {
    fn ptr(&self) -> Type {
        self.frontend.pointer_type()
    }

    fn call_conv(&self) -> CallConv {
        self.frontend.default_call_conv
    }

    /// The signature of every kernel function: `(inputs: *const *const f32, out: *mut f32)`;
    /// `inputs` holds a pointer per kernel input, then the cancel word's address and the
    /// number that means "stop" ([`crate::cancel::Token::flag`]).
    pub fn kernel_signature(&self) -> Signature {
        let mut sig = Signature::new(self.call_conv());
        sig.params.extend([AbiParam::new(self.ptr()), AbiParam::new(self.ptr())]);
        sig
    }
}

/// The map a matmul epilogue runs over the contiguous `[batch.., m, n]` product: the
/// epilogue's inputs, then the product itself as the last input (read where it is
/// written), with [`Node::Acc`] reading that input. `None` when there is no epilogue.
pub(super) fn epilogue_map(k: &MatMulKernel) -> Option<MapKernel> {
    if k.epilogue.is_empty() {
        return None;
    }
    let dims: Vec<usize> = k.batch.iter().copied().chain([k.m, k.n]).collect();
    let acc = k.epilogue_inputs.len() as u32;
    let nodes = k.epilogue.iter().map(|&n| if n == Node::Acc { Node::Input(acc) } else { n }).collect();
    let mut inputs = k.epilogue_inputs.clone();
    inputs.push(Access::contiguous(&dims));
    Some(MapKernel {
        shape: dims.clone(),
        inputs,
        nodes,
        output: Access::contiguous(&dims),
        rows: vec![],
        reduce: None,
        compute: Compute::F32,
    })
}

/// Simplified loop axes: `dims[a]` with `strides[a][buffer]` (inputs, then the output,
/// then the linear element index used by `iota`/`rand`).
#[derive(Debug, Clone)]
struct Space {
    dims: Vec<usize>,
    strides: Vec<Vec<i64>>,
}

impl Space {
    /// The axes `axes` of `shape`, each buffer's stride along it from `columns`, with
    /// size-1 axes dropped and mergeable neighbours merged. `pad` keeps at least one axis.
    fn new(shape: &[usize], axes: &[usize], columns: &[Vec<i64>], pad: bool) -> Space {
        let mut space = Space { dims: vec![], strides: vec![] };
        for &axis in axes {
            let d = shape[axis];
            if d == 1 {
                continue;
            }
            let s: Vec<i64> = columns.iter().map(|c| c[axis]).collect();
            let mergeable = space.dims.last().is_some_and(|&outer| outer.checked_mul(d).is_some())
                && space.strides.last().is_some_and(|outer| {
                    outer.iter().zip(&s).all(|(&o, &i)| i64::try_from(d).ok().and_then(|d| i.checked_mul(d)) == Some(o))
                });
            if mergeable {
                let last = space.dims.len() - 1;
                space.dims[last] *= d;
                space.strides[last] = s;
            } else {
                space.dims.push(d);
                space.strides.push(s);
            }
        }
        if pad && space.dims.is_empty() {
            space.dims.push(1);
            space.strides.push(vec![0; columns.len()]);
        }
        space
    }
}

/// What a pass does with the value of its target node at each element.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sink {
    /// Reduce it into in-row reduction node `n` (for later passes).
    Node(usize),
    /// Reduce it into the row's output element (`reduce: Some(op)` kernels).
    Output,
    /// Store it at each element's output address.
    Store,
}

/// One loop over a row.
#[derive(Debug, Clone)]
struct Pass {
    target: usize,
    reduce: Option<ReduceOp>,
    sink: Sink,
    /// Nodes this pass computes (in-row reductions count as computed: they are inputs).
    needed: Vec<bool>,
    /// Whether the innermost axis runs in `f32x4`.
    vector: bool,
    /// A node whose value this pass also stores at each element's output address, for the
    /// final pass to load back instead of recomputing it.
    save: Option<usize>,
    /// A node this pass loads from each element's output address (saved there by the last
    /// reduction pass) instead of computing it.
    reuse: Option<usize>,
}

/// The nodes `start` depends on, stopping at in-row reductions (computed by earlier passes).
fn cone(nodes: &[Node], start: usize) -> Vec<bool> {
    cone_to(nodes, start, usize::MAX)
}

/// [`cone`], with `leaf` also a leaf: the nodes `start` needs once `leaf` is known.
fn cone_to(nodes: &[Node], start: usize, leaf: usize) -> Vec<bool> {
    let mut needed = vec![false; nodes.len()];
    let mut stack = vec![start];
    while let Some(i) = stack.pop() {
        if needed[i] {
            continue;
        }
        needed[i] = true;
        if i != leaf && !matches!(nodes[i], Node::Reduce(..)) {
            stack.extend(nodes[i].operands().into_iter().map(|o| o as usize));
        }
    }
    needed
}

/// Whether a node costs much more than a load and a store: transcendental functions,
/// division and square roots, and calls.
fn is_costly(node: &Node) -> bool {
    match node {
        Node::Unary(op, _) => op.is_costly(),
        Node::Binary(op, ..) => op.is_costly(),
        Node::Rand { .. } | Node::Randn { .. } => true,
        _ => false,
    }
}

/// Whether distinct points of a loop nest with these extents and strides are distinct
/// elements (sufficient test: each stride, by size, steps over everything the smaller ones
/// reach).
fn is_injective(dims: &[usize], strides: &[i64]) -> bool {
    let mut axes: Vec<(i128, i128)> = Vec::new();
    for (&d, &s) in dims.iter().zip(strides) {
        if d > 1 {
            if s == 0 {
                return false;
            }
            axes.push((i128::from(s).abs(), d as i128));
        }
    }
    axes.sort_unstable();
    let mut reach = 0i128;
    for (s, d) in axes {
        if s <= reach {
            return false;
        }
        reach += s * (d - 1);
    }
    true
}

#[cfg(test)]
thread_local! {
    /// Tests turn the reuse of the last reduction pass's values off, to compare.
    pub(super) static NO_REUSE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The node the final pass of a row kernel loads from the output instead of recomputing
/// it (see [`Plan::reuse`]), if any.
#[cfg(test)]
pub(super) fn reused_node(k: &MapKernel) -> Option<usize> {
    Plan::new(k).passes.last().and_then(|p| p.reuse)
}

/// The loop structure of one map kernel (everything decided before emitting code).
#[derive(Debug)]
struct Plan {
    kept: Space,
    row: Space,
    passes: Vec<Pass>,
    /// Elements per row (the divisor of `mean`).
    row_len: usize,
    inputs: usize,
}

impl Plan {
    fn new(k: &MapKernel) -> Plan {
        let rank = k.shape.len();
        let inputs = k.inputs.len();
        let uses_index =
            k.nodes.iter().any(|n| matches!(n, Node::Iota { .. } | Node::Rand { .. } | Node::Randn { .. }));
        let mut columns: Vec<Vec<i64>> = k.inputs.iter().map(|a| a.strides.clone()).collect();
        // A plain map is one row of every axis; a reduction without row axes reduces each
        // element alone.
        let (kept_axes, row_axes): (Vec<usize>, Vec<usize>) = if k.rows.is_empty() && k.reduce.is_none() {
            (vec![], (0..rank).collect())
        } else {
            (0..rank).partition(|a| !k.rows.contains(a))
        };
        // A reduction writes one value per row: the output does not move along the row axes.
        let output: Vec<i64> = (0..rank)
            .map(|a| if k.reduce.is_some() && row_axes.contains(&a) { 0 } else { k.output.strides[a] })
            .collect();
        columns.push(output);
        columns.push(if uses_index { gt_ir::kernel::row_major_strides(&k.shape) } else { vec![0; rank] });
        let kept = Space::new(&k.shape, &kept_axes, &columns, false);
        let row = Space::new(&k.shape, &row_axes, &columns, true);
        let row_len = row_axes.iter().fold(1usize, |n, &a| n.saturating_mul(k.shape[a]));

        // In-row reductions the result needs, transitively; node order is a valid order.
        let last = k.nodes.len() - 1;
        let mut required = vec![false; k.nodes.len()];
        let mut work = vec![cone(&k.nodes, last)];
        while let Some(needed) = work.pop() {
            for (i, _) in needed.iter().enumerate().filter(|(_, &n)| n) {
                if let Node::Reduce(_, a) = k.nodes[i] {
                    if !required[i] {
                        required[i] = true;
                        work.push(cone(&k.nodes, a as usize));
                    }
                }
            }
        }
        let inner = row.strides.last().cloned().unwrap_or_default();
        let vector_ok = |needed: &[bool], store: bool| {
            let inputs_ok = needed.iter().zip(&k.nodes).filter(|(&n, _)| n).all(|(_, node)| match *node {
                Node::Input(i) => matches!(inner[i as usize], 0 | 1),
                Node::Iota { .. } | Node::Rand { .. } | Node::Randn { .. } => false,
                _ => true,
            });
            // `f64` and integer kernels run one element at a time (`wide.rs`).
            let f32s = k.compute == Compute::F32;
            f32s && inputs_ok && (!store || inner[inputs] == 1) && row.dims.last().is_some_and(|&n| n >= 4)
        };
        let mut passes = Vec::new();
        for (r, node) in k.nodes.iter().enumerate() {
            if let (true, Node::Reduce(op, a)) = (required[r], *node) {
                let needed = cone(&k.nodes, a as usize);
                let vector = vector_ok(&needed, false);
                passes.push(Pass {
                    target: a as usize,
                    reduce: Some(op),
                    sink: Sink::Node(r),
                    needed,
                    vector,
                    save: None,
                    reuse: None,
                });
            }
        }
        let needed = cone(&k.nodes, last);
        let sink = if k.reduce.is_some() { Sink::Output } else { Sink::Store };
        let vector = vector_ok(&needed, sink == Sink::Store);
        passes.push(Pass { target: last, reduce: k.reduce, sink, needed, vector, save: None, reuse: None });
        let mut plan = Plan { kept, row, passes, row_len, inputs };
        plan.reuse(k);
        plan
    }

    /// Lets the final pass of a row map (softmax's `e / sum(e)`) load the costliest value
    /// the last reduction pass computed already (`e = exp(x - max)`) instead of recomputing
    /// it: that pass stores it in the output element, which the final pass reads back at
    /// the same address before overwriting it. The value is the same `f32` either way (one
    /// and four lanes compute the same bits, and both passes split the row alike), so the
    /// result does not change. Only where every point of a row writes its own element (so
    /// nothing else overwrites the value in between) and inputs are other buffers.
    fn reuse(&mut self, k: &MapKernel) {
        #[cfg(test)]
        if NO_REUSE.with(|c| c.get()) {
            return;
        }
        let n = self.passes.len();
        // An `f64` or integer kernel's output may be narrower than its values (`i32`).
        if k.reduce.is_some() || n < 2 || k.compute != Compute::F32 {
            return;
        }
        let (last, fin) = (&self.passes[n - 2], &self.passes[n - 1]);
        let out = self.inputs;
        let outputs: Vec<i64> = self.row.strides.iter().map(|s| s[out]).collect();
        if last.vector != fin.vector || !is_injective(&self.row.dims, &outputs) {
            return;
        }
        // Nodes that change along the innermost axis (the others are hoisted out of it).
        let inner = self.row.strides.last().cloned().unwrap_or_default();
        let mut varies = vec![false; k.nodes.len()];
        for (i, node) in k.nodes.iter().enumerate() {
            varies[i] = match *node {
                Node::Input(x) => inner[x as usize] != 0,
                Node::Iota { .. } | Node::Rand { .. } | Node::Randn { .. } => true,
                Node::Reduce(..) | Node::Const(_) | Node::Const64(_) | Node::Acc => false,
                _ => node.operands().iter().any(|&o| varies[o as usize]),
            };
        }
        let cost = |needed: &[bool]| {
            needed.iter().zip(&k.nodes).zip(&varies).filter(|((&n, node), &v)| n && v && is_costly(node)).count()
        };
        let full = cost(&fin.needed);
        // The candidate saving the most costly nodes, the latest of equals.
        let mut best: Option<(usize, usize, Vec<bool>)> = None;
        for c in 0..k.nodes.len() {
            if !(last.needed[c] && fin.needed[c] && varies[c]) || matches!(k.nodes[c], Node::Reduce(..)) {
                continue;
            }
            let mut needed = cone_to(&k.nodes, fin.target, c);
            // The candidate itself is loaded, not computed.
            needed[c] = false;
            let saved = full - cost(&needed);
            needed[c] = true;
            if saved > 0 && best.as_ref().is_none_or(|b| saved >= b.0) {
                best = Some((saved, c, needed));
            }
        }
        if let Some((_, c, needed)) = best {
            self.passes[n - 2].save = Some(c);
            let fin = &mut self.passes[n - 1];
            fin.needed = needed;
            fin.reuse = Some(c);
        }
    }
}

/// A counted loop under construction.
struct Loop {
    var: Variable,
    body: Block,
    exit: Block,
    step: i64,
    end: i64,
}

/// A reduction's running value: `f64` for sums, `f32` for max/min.
struct Accumulator {
    op: ReduceOp,
    scalar: Variable,
    /// Vector lanes: two `f64x2` (sums) or one `f32x4` (max/min).
    vector: Vec<Variable>,
}

/// Emits one map kernel's function body.
struct Gen<'a, 'f> {
    b: FunctionBuilder<'f>,
    k: &'a MapKernel,
    plan: Plan,
    target: Target,
    /// Base pointer of every input, then of the output.
    base: Vec<Value>,
    /// Imported shims, on first use.
    shims: [Option<FuncRef>; Shim::ALL.len()],
    /// How each buffer's elements are stored: inputs, then the output.
    storage: Vec<Storage>,
    /// This row's in-row reduction results (scalar `f32`), by node.
    reduced: Vec<Option<Value>>,
    /// The cancel word's address and the value that means "stop" ([`crate::cancel`]),
    /// passed after the input pointers; and the block that returns early.
    stop: Option<(Value, Value, Block)>,
    /// Loops open around the code being emitted.
    depth: usize,
}

/// Vectors per iteration of a cheap pass's innermost loop ([`Gen::innermost`]).
const UNROLL: i64 = 4;

/// Memory flags of every load and store: the bounds check before the call guarantees
/// every address is inside its buffer, but nothing is assumed about alignment.
pub(super) fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Whether [`map_function`] compiles `k` over buffers stored as `storage`: `f32` kernels
/// without `round` nodes over `f32` buffers (halves and `bool`s are widened before), and
/// `f64` and `i64` maps and reductions (but integer means; no values made from indices: the
/// fuse pass makes none) over buffers of their own dtypes (`i64` kernels: `i64`, `i32`,
/// `bool`) and `bool`s (read as 0 and 1, stored nonzero as true).
pub(super) fn compiles(k: &MapKernel, storage: &BufferStorage) -> bool {
    let buffers = storage.inputs.len() == k.inputs.len()
        && storage.inputs.iter().chain([&storage.output]).all(|&s| wide::holds(k.compute, s));
    if k.compute == Compute::F32 {
        return buffers && k.is_plain_f32();
    }
    // Integer means are refused by the type rules; a kernel written by hand gets the oracle.
    let float = k.compute == Compute::F64;
    let nodes = k.nodes.iter().all(|n| match *n {
        Node::Round(s, _) => wide::rounds_through(k.compute, s),
        Node::Reduce(op, _) => float || op != ReduceOp::Mean,
        Node::Iota { .. } | Node::Rand { .. } | Node::Randn { .. } | Node::Acc => false,
        _ => true,
    });
    // An empty row's integer max is its dtype's least value, which an `i64` kernel does not
    // know: the oracle computes empty rows.
    let empty_rows = k.rows.iter().any(|&a| k.shape.get(a) == Some(&0));
    buffers && nodes && (float || k.reduce != Some(ReduceOp::Mean)) && !empty_rows
}

/// The CLIF function of a map kernel (already validated) over buffers stored as `storage`,
/// named `name`.
pub(super) fn map_function(
    k: &MapKernel,
    storage: &BufferStorage,
    target: Target,
    name: UserFuncName,
) -> Result<Function, JitError> {
    if k.nodes.is_empty() {
        return Err(JitError::Invalid(gt_ir::kernel::KernelError::NoNodes));
    }
    // What the fuse pass never makes, and no code below handles.
    if !compiles(k, storage) {
        return Err(JitError::Compute { compute: k.compute });
    }
    let mut func = Function::with_name_signature(name, target.kernel_signature());
    let mut fctx = FunctionBuilderContext::new();
    let b = FunctionBuilder::new(&mut func, &mut fctx);
    let mut g = Gen {
        b,
        k,
        plan: Plan::new(k),
        target,
        base: vec![],
        shims: [None; Shim::ALL.len()],
        storage: storage.inputs.iter().copied().chain([storage.output]).collect(),
        reduced: vec![None; k.nodes.len()],
        stop: None,
        depth: 0,
    };
    g.body();
    g.b.seal_all_blocks();
    g.b.finalize(target.frontend);
    Ok(func)
}

impl<'f> Gen<'_, 'f> {
    fn body(&mut self) {
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let (inputs, out) = (self.b.block_params(entry)[0], self.b.block_params(entry)[1]);
        let ptr = self.target.ptr();
        for i in 0..self.plan.inputs {
            let p = self.b.ins().load(ptr, mem(), inputs, (i * ptr.bytes() as usize) as i32);
            self.base.push(p);
        }
        self.base.push(out);
        // After the inputs: where to look for a cancel, and what it reads when this call's
        // instruction is cancelled.
        let at = |i: usize| (i * ptr.bytes() as usize) as i32;
        let word = self.b.ins().load(ptr, mem(), inputs, at(self.plan.inputs));
        let mut mine = self.b.ins().load(ptr, mem(), inputs, at(self.plan.inputs + 1));
        if ptr != types::I64 {
            mine = self.b.ins().uextend(types::I64, mine);
        }
        let stop = self.b.create_block();
        self.stop = Some((word, mine, stop));
        // Element offsets of iteration point 0: inputs, output, then the linear index.
        let starts: Vec<i64> = self.k.inputs.iter().chain([&self.k.output]).map(|a| a.offset).chain([0]).collect();
        let offsets = starts.into_iter().map(|o| self.b.ins().iconst(types::I64, o)).collect();
        self.kept_level(0, offsets);
        self.b.ins().return_(&[]);
        self.b.switch_to_block(stop);
        self.b.ins().return_(&[]);
    }

    fn shim(&mut self, shim: Shim) -> FuncRef {
        if let Some(f) = self.shims[shim as usize] {
            return f;
        }
        let func = &mut self.b.func;
        let signature = func.import_signature(shim.signature(self.target.call_conv()));
        let name = func.declare_imported_user_function(UserExternalName::new(0, shim as u32));
        let f = func.import_function(ExtFuncData {
            name: ExternalName::user(name),
            signature,
            colocated: false,
            patchable: false,
        });
        self.shims[shim as usize] = Some(f);
        f
    }

    /// Opens `for i in (start..end).step_by(step)`, rotated: the bound is tested before the
    /// first iteration and then at the bottom of each, so an iteration takes one branch.
    fn loop_begin(&mut self, start: i64, end: i64, step: i64) -> (Value, Loop) {
        let var = self.b.declare_var(types::I64);
        let s = self.b.ins().iconst(types::I64, start);
        self.b.def_var(var, s);
        let (body, exit) = (self.b.create_block(), self.b.create_block());
        let more = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, s, end);
        self.b.ins().brif(more, body, &[], exit, &[]);
        self.b.switch_to_block(body);
        // The outermost loop looks at the cancel word once per iteration: an iteration does
        // the whole work of everything nested in it, so the look costs nothing measurable
        // there, and a cancelled kernel stops within one iteration.
        if self.depth == 0 {
            if let Some((word, mine, stop)) = self.stop {
                let seen = self.b.ins().load(types::I64, MemFlagsData::new().with_notrap(), word, 0);
                let hit = self.b.ins().icmp(IntCC::Equal, seen, mine);
                let go = self.b.create_block();
                self.b.ins().brif(hit, stop, &[], go, &[]);
                self.b.switch_to_block(go);
            }
        }
        self.depth += 1;
        let i = self.b.use_var(var);
        (i, Loop { var, body, exit, step, end })
    }

    fn loop_end(&mut self, l: Loop) {
        self.depth -= 1;
        let i = self.b.use_var(l.var);
        let next = self.b.ins().iadd_imm_s(i, l.step);
        self.b.def_var(l.var, next);
        let more = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, next, l.end);
        self.b.ins().brif(more, l.body, &[], l.exit, &[]);
        self.b.switch_to_block(l.exit);
    }

    /// `offsets + i * strides`, buffer by buffer.
    fn advance(&mut self, offsets: &[Value], i: Value, strides: &[i64]) -> Vec<Value> {
        offsets
            .iter()
            .zip(strides)
            .map(|(&o, &s)| {
                if s == 0 {
                    o
                } else {
                    let t = self.b.ins().imul_imm_s(i, s);
                    self.b.ins().iadd(o, t)
                }
            })
            .collect()
    }

    fn kept_level(&mut self, level: usize, offsets: Vec<Value>) {
        if level == self.plan.kept.dims.len() {
            return self.row_work(&offsets);
        }
        let (d, strides) = (self.plan.kept.dims[level], self.plan.kept.strides[level].clone());
        let (i, l) = self.loop_begin(0, d as i64, 1);
        let next = self.advance(&offsets, i, &strides);
        self.kept_level(level + 1, next);
        self.loop_end(l);
    }

    /// Every pass over one row.
    fn row_work(&mut self, offsets: &[Value]) {
        self.reduced.iter_mut().for_each(|r| *r = None);
        for p in 0..self.plan.passes.len() {
            let pass = self.plan.passes[p].clone();
            let acc = pass.reduce.map(|op| self.accumulator(op, pass.vector));
            self.row_level(&pass, acc.as_ref(), 0, offsets.to_vec());
            let Some(acc) = acc else { continue };
            let value = self.finish(&acc);
            match pass.sink {
                Sink::Node(r) => self.reduced[r] = Some(value),
                Sink::Output => {
                    let out = self.plan.inputs;
                    let addr = self.address(out, offsets[out]);
                    self.store(out, value, addr);
                }
                Sink::Store => {}
            }
        }
    }

    /// Bytes per element of `buffer`, as a shift.
    fn shift(&self, buffer: usize) -> u32 {
        self.storage[buffer].bytes().trailing_zeros()
    }

    /// `base[buffer] + offset * element size`.
    fn address(&mut self, buffer: usize, offset: Value) -> Value {
        let shift = self.shift(buffer);
        let bytes = self.b.ins().ishl_imm_u(offset, i64::from(shift));
        let bytes =
            if self.target.ptr() == types::I64 { bytes } else { self.b.ins().ireduce(self.target.ptr(), bytes) };
        self.b.ins().iadd(self.base[buffer], bytes)
    }

    fn accumulator(&mut self, op: ReduceOp, vector: bool) -> Accumulator {
        if self.k.compute != Compute::F32 {
            // One lane, in the kernel's type, in row order: the eager reductions' folds
            // (`f64` sums from -0, `nan_max`/`nan_min` from -inf/+inf, wrapping integer
            // sums).
            let ty = wide::scalar_type(self.k.compute);
            let scalar = self.b.declare_var(ty);
            let init = self.wide().reduce_init(op);
            self.b.def_var(scalar, init);
            return Accumulator { op, scalar, vector: vec![] };
        }
        let sum = matches!(op, ReduceOp::Sum | ReduceOp::Mean);
        let scalar = self.b.declare_var(if sum { types::F64 } else { types::F32 });
        let init = match op {
            // -0 is the identity of addition (and what Rust's float `sum` starts from, so an
            // empty or all-negative-zero row sums to -0 like the oracle's).
            ReduceOp::Sum | ReduceOp::Mean => self.b.ins().f64const(-0.0),
            ReduceOp::Max => self.b.ins().f32const(f32::NEG_INFINITY),
            ReduceOp::Min => self.b.ins().f32const(f32::INFINITY),
        };
        self.b.def_var(scalar, init);
        let mut lanes = Vec::new();
        if vector {
            let (ty, count) = if sum { (types::F64X2, 2) } else { (types::F32X4, 1) };
            let v = self.b.ins().splat(ty, init);
            for _ in 0..count {
                let var = self.b.declare_var(ty);
                self.b.def_var(var, v);
                lanes.push(var);
            }
        }
        Accumulator { op, scalar, vector: lanes }
    }

    /// Folds `x` (one or four lanes) into the accumulator.
    fn accumulate(&mut self, acc: &Accumulator, lanes: Lanes, x: Value) {
        if self.k.compute != Compute::F32 {
            let s = self.b.use_var(acc.scalar);
            let s = self.wide().reduce_step(acc.op, s, x);
            self.b.def_var(acc.scalar, s);
            return;
        }
        match (acc.op, lanes) {
            (ReduceOp::Sum | ReduceOp::Mean, Lanes::One) => {
                let wide = self.b.ins().fpromote(types::F64, x);
                let s = self.b.use_var(acc.scalar);
                let s = self.b.ins().fadd(s, wide);
                self.b.def_var(acc.scalar, s);
            }
            (ReduceOp::Sum | ReduceOp::Mean, Lanes::Four) => {
                let lo = self.b.ins().fvpromote_low(x);
                let little = MemFlagsData::new().with_endianness(Endianness::Little);
                let bytes = self.b.ins().bitcast(types::I8X16, little, x);
                let mask: Vec<u8> = (8..16).chain(8..16).collect();
                let mask = self.b.func.dfg.immediates.push(ConstantData::from(mask));
                let high = self.b.ins().shuffle(bytes, bytes, mask);
                let high = self.b.ins().bitcast(types::F32X4, little, high);
                let hi = self.b.ins().fvpromote_low(high);
                for (var, part) in acc.vector.iter().zip([lo, hi]) {
                    let s = self.b.use_var(*var);
                    let s = self.b.ins().fadd(s, part);
                    self.b.def_var(*var, s);
                }
            }
            (op, lanes) => {
                let var = if lanes == Lanes::One { acc.scalar } else { acc.vector[0] };
                let m = self.b.use_var(var);
                let mut e = Emit { b: &mut self.b, lanes, fma: self.target.fma, powf: None };
                let m = if op == ReduceOp::Max { e.nan_max(m, x) } else { e.nan_min(m, x) };
                self.b.def_var(var, m);
            }
        }
    }

    /// The row's reduction as a scalar `f32` (in an `f64` or `i64` kernel, in its type).
    fn finish(&mut self, acc: &Accumulator) -> Value {
        let mut s = self.b.use_var(acc.scalar);
        if self.k.compute != Compute::F32 {
            if acc.op == ReduceOp::Mean {
                // `compiles` refuses integer means; 0 / 0 is NaN, as eager.
                let n = self.b.ins().f64const(self.plan.row_len as f64);
                s = self.b.ins().fdiv(s, n);
            }
            return s;
        }
        match acc.op {
            ReduceOp::Sum | ReduceOp::Mean => {
                if let [lo, hi] = acc.vector[..] {
                    let (lo, hi) = (self.b.use_var(lo), self.b.use_var(hi));
                    let v = self.b.ins().fadd(lo, hi);
                    for lane in 0..2u8 {
                        let x = self.b.ins().extractlane(v, lane);
                        s = self.b.ins().fadd(s, x);
                    }
                }
                if acc.op == ReduceOp::Mean {
                    // 0 / 0: the mean of an empty row is NaN, as in the interpreter.
                    let n = self.b.ins().f64const(self.plan.row_len as f64);
                    s = self.b.ins().fdiv(s, n);
                }
                self.b.ins().fdemote(types::F32, s)
            }
            op => {
                if let [v] = acc.vector[..] {
                    let v = self.b.use_var(v);
                    for lane in 0..4u8 {
                        let x = self.b.ins().extractlane(v, lane);
                        let mut e = Emit { b: &mut self.b, lanes: Lanes::One, fma: self.target.fma, powf: None };
                        s = if op == ReduceOp::Max { e.nan_max(s, x) } else { e.nan_min(s, x) };
                    }
                }
                s
            }
        }
    }

    fn row_level(&mut self, pass: &Pass, acc: Option<&Accumulator>, level: usize, offsets: Vec<Value>) {
        if level + 1 == self.plan.row.dims.len() {
            return self.innermost(pass, acc, &offsets);
        }
        let (d, strides) = (self.plan.row.dims[level], self.plan.row.strides[level].clone());
        let (i, l) = self.loop_begin(0, d as i64, 1);
        let next = self.advance(&offsets, i, &strides);
        self.row_level(pass, acc, level + 1, next);
        self.loop_end(l);
    }

    /// The innermost row axis: `f32x4` steps then a scalar tail, or scalar at any stride.
    fn innermost(&mut self, pass: &Pass, acc: Option<&Accumulator>, offsets: &[Value]) {
        let n = *self.plan.row.dims.last().expect("the row space has an axis") as i64;
        if n == 0 {
            // Nothing is read: not even the hoisted loads, whose addresses are unchecked.
            return;
        }
        let strides = self.plan.row.strides.last().expect("the row space has an axis").clone();
        let out = self.plan.inputs;
        // Each buffer's address at element 0 of this row segment.
        let mut ptrs: Vec<Option<Value>> = vec![None; out + 1];
        for (i, node) in self.k.nodes.iter().enumerate() {
            if let (true, Node::Input(x)) = (pass.needed[i], node) {
                let x = *x as usize;
                if ptrs[x].is_none() {
                    ptrs[x] = Some(self.address(x, offsets[x]));
                }
            }
        }
        if pass.sink == Sink::Store || pass.save.is_some() {
            ptrs[out] = Some(self.address(out, offsets[out]));
        }
        let invariant = self.invariants(pass, &strides, &ptrs);
        let vector_end = if pass.vector { n - n % 4 } else { 0 };
        if vector_end > 0 {
            let mut wide = invariant.clone();
            for v in wide.iter_mut().flatten() {
                *v = self.b.ins().splat(types::F32X4, *v);
            }
            // A pass of cheap ops takes four vectors per iteration: the loop's own work (the
            // bound, the cancel look) was most of its time. A pass with a costly op keeps one
            // (unrolled it measured slower: register spills). The vectors keep their order,
            // so a reduction's sum is the same either way.
            let cheap = !self.k.nodes.iter().zip(&pass.needed).any(|(node, &needed)| needed && is_costly(node));
            let unrolled_end = if cheap { n - n % (4 * UNROLL) } else { 0 };
            if unrolled_end > 0 {
                let (j, l) = self.loop_begin(0, unrolled_end, 4 * UNROLL);
                for u in 0..UNROLL {
                    let ju = if u == 0 { j } else { self.b.ins().iadd_imm_s(j, 4 * u) };
                    let x = self.element(pass, Lanes::Four, &wide, &ptrs, &strides, offsets, ju);
                    self.consume(pass, acc, Lanes::Four, x, &ptrs, &strides, ju);
                }
                self.loop_end(l);
            }
            if unrolled_end < vector_end {
                let (j, l) = self.loop_begin(unrolled_end, vector_end, 4);
                let x = self.element(pass, Lanes::Four, &wide, &ptrs, &strides, offsets, j);
                self.consume(pass, acc, Lanes::Four, x, &ptrs, &strides, j);
                self.loop_end(l);
            }
        }
        let (j, l) = self.loop_begin(vector_end, n, 1);
        let x = self.element(pass, Lanes::One, &invariant, &ptrs, &strides, offsets, j);
        self.consume(pass, acc, Lanes::One, x, &ptrs, &strides, j);
        self.loop_end(l);
    }

    /// Scalar values of the nodes that do not change along the innermost axis.
    fn invariants(&mut self, pass: &Pass, strides: &[i64], ptrs: &[Option<Value>]) -> Vec<Option<Value>> {
        let mut values: Vec<Option<Value>> = vec![None; self.k.nodes.len()];
        for (i, &node) in self.k.nodes.iter().enumerate().take(pass.target + 1) {
            if !pass.needed[i] || pass.reuse == Some(i) {
                continue;
            }
            let known = |n: u32| values[n as usize];
            values[i] = match node {
                Node::Const(_) | Node::Const64(_) => Some(self.constant(node)),
                Node::Reduce(..) => self.reduced[i],
                Node::Input(x) if strides[x as usize] == 0 => {
                    let p = ptrs[x as usize].expect("needed inputs have addresses");
                    Some(self.load(x as usize, Lanes::One, p))
                }
                // An op is invariant when all its operands are.
                Node::Unary(..) | Node::Binary(..) | Node::Select(..) | Node::Round(..) => {
                    let operands: Option<Vec<Value>> = node.operands().into_iter().map(known).collect();
                    operands.map(|o| self.op(Lanes::One, node, &o))
                }
                _ => None,
            };
        }
        values
    }

    /// A constant node's value, one lane, in the kernel's type.
    fn constant(&mut self, node: Node) -> Value {
        match (node, self.k.compute) {
            (Node::Const(bits), Compute::F32) => self.b.ins().f32const(Ieee32::with_bits(bits)),
            (Node::Const64(bits), Compute::F32) => self.b.ins().f32const(f64::from_bits(bits) as f32),
            (Node::Const(bits), _) => self.wide().constant(f64::from(f32::from_bits(bits))),
            (Node::Const64(bits), _) => self.wide().constant(f64::from_bits(bits)),
            _ => unreachable!("only constants"),
        }
    }

    /// The element of `buffer` at `addr`, in the kernel's type (four `f32` lanes or one).
    fn load(&mut self, buffer: usize, lanes: Lanes, addr: Value) -> Value {
        match (self.k.compute, lanes) {
            (Compute::F32, Lanes::One) => self.b.ins().load(types::F32, mem(), addr, 0),
            (Compute::F32, Lanes::Four) => self.b.ins().load(types::F32X4, mem(), addr, 0),
            _ => {
                let storage = self.storage[buffer];
                self.wide().load(storage, addr)
            }
        }
    }

    /// Stores `x` (in the kernel's type) as the element of `buffer` at `addr`.
    fn store(&mut self, buffer: usize, x: Value, addr: Value) {
        if self.k.compute == Compute::F32 {
            self.b.ins().store(mem(), x, addr, 0);
        } else {
            let storage = self.storage[buffer];
            self.wide().store(storage, x, addr);
        }
    }

    /// An op node's value over its operands' values.
    fn op(&mut self, lanes: Lanes, node: Node, operands: &[Value]) -> Value {
        if self.k.compute != Compute::F32 {
            if let Some(shim) = wide::shim_of(&node, self.k.compute) {
                self.shim(shim);
            }
            let mut w = self.wide();
            return match node {
                Node::Unary(op, _) => w.unary(op, operands[0]),
                Node::Binary(op, ..) => w.binary(op, operands[0], operands[1]),
                Node::Select(..) => w.select(operands[0], operands[1], operands[2]),
                Node::Round(storage, _) => w.round(storage, operands[0]),
                _ => unreachable!("only ops"),
            };
        }
        if needs_powf(&node) {
            self.shim(Shim::Powf);
        }
        let mut e = self.emit(lanes);
        match node {
            Node::Unary(op, _) => e.unary(op, operands[0]),
            Node::Binary(op, ..) => e.binary(op, operands[0], operands[1]),
            Node::Select(..) => e.where_(operands[0], operands[1], operands[2]),
            _ => unreachable!("`compiles` refuses `round` nodes in f32 kernels"),
        }
    }

    fn wide(&mut self) -> Wide<'_, 'f> {
        Wide { b: &mut self.b, compute: self.k.compute, shims: &self.shims }
    }

    fn emit(&mut self, lanes: Lanes) -> Emit<'_, 'f> {
        Emit { b: &mut self.b, lanes, fma: self.target.fma, powf: self.shims[Shim::Powf as usize] }
    }

    /// The address of element `j` of the innermost axis in `buffer`, whose row segment
    /// starts at `ptr`.
    fn element_address(&mut self, buffer: usize, ptr: Value, stride: i64, j: Value) -> Value {
        let size = 1i64 << self.shift(buffer);
        let off = self.b.ins().imul_imm_s(j, stride.wrapping_mul(size));
        let off = if self.target.ptr() == types::I64 { off } else { self.b.ins().ireduce(self.target.ptr(), off) };
        self.b.ins().iadd(ptr, off)
    }

    /// The target node's value at element `j` (the first of four with `Lanes::Four`).
    #[allow(clippy::too_many_arguments)]
    fn element(
        &mut self,
        pass: &Pass,
        lanes: Lanes,
        invariant: &[Option<Value>],
        ptrs: &[Option<Value>],
        strides: &[i64],
        offsets: &[Value],
        j: Value,
    ) -> Value {
        let mut values = invariant.to_vec();
        let fty = if lanes == Lanes::One { wide::scalar_type(self.k.compute) } else { types::F32X4 };
        for (i, &node) in self.k.nodes.iter().enumerate().take(pass.target + 1) {
            if !pass.needed[i] || values[i].is_some() {
                continue;
            }
            let v = |n: u32| values[n as usize].expect("operands precede their users");
            let value = match node {
                // Saved in the output element by the last reduction pass.
                _ if pass.reuse == Some(i) => {
                    let out = self.plan.inputs;
                    let p = ptrs[out].expect("stores have an address");
                    let addr = self.element_address(out, p, strides[out], j);
                    self.load(out, lanes, addr)
                }
                Node::Input(x) => {
                    let x = x as usize;
                    let p = ptrs[x].expect("needed inputs have addresses");
                    let addr = self.element_address(x, p, strides[x], j);
                    self.load(x, lanes, addr)
                }
                Node::Iota { start, step } => {
                    let index = self.linear_index(strides, offsets, j);
                    let f = self.b.ins().fcvt_from_sint(types::F64, index);
                    let step = self.b.ins().f64const(f64::from_bits(step));
                    let start = self.b.ins().f64const(f64::from_bits(start));
                    let t = self.b.ins().fmul(f, step);
                    let t = self.b.ins().fadd(start, t);
                    self.b.ins().fdemote(types::F32, t)
                }
                Node::Rand { seed } | Node::Randn { seed } => {
                    let shim = if matches!(node, Node::Rand { .. }) { Shim::Uniform } else { Shim::Normal };
                    let f = self.shim(shim);
                    let index = self.linear_index(strides, offsets, j);
                    let seed = self.b.ins().iconst(types::I64, seed as i64);
                    let call = self.b.ins().call(f, &[seed, index]);
                    self.b.inst_results(call)[0]
                }
                Node::Unary(..) | Node::Binary(..) | Node::Select(..) | Node::Round(..) => {
                    let operands: Vec<Value> = node.operands().into_iter().map(v).collect();
                    self.op(lanes, node, &operands)
                }
                // Constants and in-row reductions are invariant; `acc` was rewritten to an input.
                Node::Const(_) | Node::Const64(_) | Node::Reduce(..) | Node::Acc => {
                    unreachable!("invariant node {i} ({node}) was not hoisted")
                }
            };
            values[i] = Some(value);
        }
        if let Some(c) = pass.save {
            let out = self.plan.inputs;
            let p = ptrs[out].expect("saving passes have the output's address");
            let addr = self.element_address(out, p, strides[out], j);
            let x = values[c].expect("the saved node is computed");
            debug_assert_eq!(self.b.func.dfg.value_type(x), fty);
            self.store(out, x, addr);
        }
        let x = values[pass.target].expect("the target is computed");
        // A target that is a scalar (an invariant) is splat already; nothing else to do.
        debug_assert_eq!(self.b.func.dfg.value_type(x), fty);
        x
    }

    /// The row-major index of element `j`, for `iota` and `rand`.
    fn linear_index(&mut self, strides: &[i64], offsets: &[Value], j: Value) -> Value {
        let lin = strides.len() - 1;
        let t = self.b.ins().imul_imm_s(j, strides[lin]);
        self.b.ins().iadd(offsets[lin], t)
    }

    #[allow(clippy::too_many_arguments)]
    fn consume(
        &mut self,
        pass: &Pass,
        acc: Option<&Accumulator>,
        lanes: Lanes,
        x: Value,
        ptrs: &[Option<Value>],
        strides: &[i64],
        j: Value,
    ) {
        match (pass.sink, acc) {
            (Sink::Store, _) => {
                let out = self.plan.inputs;
                let p = ptrs[out].expect("stores have an address");
                let addr = self.element_address(out, p, strides[out], j);
                self.store(out, x, addr);
            }
            (_, Some(acc)) => self.accumulate(acc, lanes, x),
            (_, None) => unreachable!("a reducing pass has an accumulator"),
        }
    }
}
