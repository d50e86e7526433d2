//! Plain map kernels with costly nodes (`exp log tanh sigmoid erf`), or over buffers of halves
//! or `bool`s (which compiled code, reading and writing `f32` only, would convert whole first),
//! run tile by tile: each
//! node is computed over a tile of a few hundred elements by a slice loop (the costly ones by
//! `vmath`'s functions, sixteen lanes wide with AVX-512 or eight with AVX2, where Cranelift
//! emits four; the others by the op table's scalar functions in loops the compiler
//! vectorizes), so the kernel still
//! reads its inputs and writes its output once, as compiled code does, and its tiles stay in
//! the cache. The same bits as the compiled kernel: `vmath` is the JIT's math, every other
//! node the same IEEE operation. Buffers of halves are widened and rounded a tile at a time
//! ([`Stored`]), so a kernel over `bf16` passes over memory once too.
//!
//! Kernels computing in `f64` run so too ([`applies_f64`]; the compiled ones are one scalar
//! lane and call the op table's functions): `gt_ir::math64`'s functions in `vmath`'s vector
//! loops, the bits of `apply_f64`, which the eager ops and the oracle compute.
use super::Wide;
use crate::backend::cpu::vmath::{Halves, RandomKind};
use crate::backend::cpu::{threads, vmath};
use gt_ir::kernel::{BufferStorage, Compute, MapKernel, Node, Storage};
use gt_ir::ops::{BinaryKernel, BinaryKernelAs, OpDef, UnaryKernel, UnaryKernelAs};
use gt_ir::{BinaryOp, UnaryOp};
use half::{bf16, f16};
use std::mem::MaybeUninit;
use std::ops::Range;

/// A kernel's input buffer as its storage holds it (kernels compute in `f32`).
#[derive(Debug, Clone, Copy)]
pub enum Stored<'a> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `f16` elements, widened as read.
    F16(&'a [f16]),
    /// `bf16` elements, widened as read.
    Bf16(&'a [bf16]),
    /// `bool`s, read as 0 and 1 (a mask).
    Bool(&'a [bool]),
}

impl Stored<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Stored::F32(b) => b.len(),
            Stored::F16(b) => b.len(),
            Stored::Bf16(b) => b.len(),
            Stored::Bool(b) => b.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element as `f32` (borrowed when they are).
    pub(super) fn widened(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Stored::F32(b) => std::borrow::Cow::Borrowed(b),
            _ => {
                let mut out = vec![0.0f32; self.len()];
                self.widen(0, &mut out);
                std::borrow::Cow::Owned(out)
            }
        }
    }

    /// Elements `first..first + out.len()`, widened into `out`.
    fn widen(&self, first: usize, out: &mut [f32]) {
        let range = first..first + out.len();
        match self {
            Stored::F32(b) => out.copy_from_slice(&b[range]),
            Stored::F16(b) => f16::widen(&b[range], out),
            Stored::Bf16(b) => bf16::widen(&b[range], out),
            Stored::Bool(b) => out.iter_mut().zip(&b[range]).for_each(|(o, &m)| *o = f32::from(u8::from(m))),
        }
    }

    /// Element `i`, widened.
    fn at(&self, i: usize) -> f32 {
        match self {
            Stored::F32(b) => b[i],
            Stored::F16(b) => b[i].to_f32(),
            Stored::Bf16(b) => b[i].to_f32(),
            Stored::Bool(b) => f32::from(u8::from(b[i])),
        }
    }
}

/// A kernel's output buffer as its storage holds it: results are rounded as written.
#[derive(Debug)]
pub enum StoredMut<'a> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `f16` elements, rounded to nearest even.
    F16(&'a mut [f16]),
    /// `bf16` elements, rounded to nearest even.
    Bf16(&'a mut [bf16]),
    /// `bool`s: nonzero (NaN too) is true, as `.to(bool)`.
    Bool(&'a mut [bool]),
}

impl StoredMut<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            StoredMut::F32(b) => b.len(),
            StoredMut::F16(b) => b.len(),
            StoredMut::Bf16(b) => b.len(),
            StoredMut::Bool(b) => b.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A type kernels compute in by tiles (`f32`, or `f64`), with its nodes over a tile.
pub(super) trait TileType: Copy + PartialEq + Send + Sync + vmath::PutF32 + 'static {
    /// Zero (a `where` condition's false).
    const ZERO: Self;
    /// `x` (a `f32` constant or random number) in this type.
    fn from_f32(x: f32) -> Self;
    /// `x` (a `f64` constant) in this type, as the compiled kernel converts it.
    fn from_f64(x: f64) -> Self;
    /// `out[i] = op(x[i])` (primitive ops).
    fn unary(op: UnaryOp, x: &[Self], out: &mut [Self]);
    /// `out[i] = op(x[i], y[i])` (primitive ops).
    fn binary(op: BinaryOp, x: &[Self], y: &[Self], out: &mut [Self]);
    /// `out[i] = x[i]` stored as `storage` and loaded again (`f64` kernels' `round` nodes).
    fn round(storage: Storage, x: &[Self], out: &mut [Self]);
}

impl TileType for f32 {
    const ZERO: f32 = 0.0;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn unary(op: UnaryOp, x: &[f32], out: &mut [f32]) {
        match (costly(op), op.def()) {
            (Some(f), _) => f(x, out),
            (None, OpDef::Prim(p)) => p.specialize(UnaryTile(x, out)),
            (None, OpDef::Composite(_)) => unreachable!("`applies` takes primitives only"),
        }
    }
    fn binary(op: BinaryOp, x: &[f32], y: &[f32], out: &mut [f32]) {
        match op.def() {
            OpDef::Prim(p) => p.specialize(BinaryTile(x, y, out)),
            OpDef::Composite(_) => unreachable!("`applies` takes primitives only"),
        }
    }
    fn round(_: Storage, _: &[f32], _: &mut [f32]) {
        unreachable!("`applies` takes no `round` in f32 kernels")
    }
}

impl TileType for f64 {
    const ZERO: f64 = 0.0;
    fn from_f32(x: f32) -> f64 {
        f64::from(x)
    }
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn unary(op: UnaryOp, x: &[f64], out: &mut [f64]) {
        match op.def() {
            OpDef::Prim(p) if vmath::map_f64(p, x, out) => {}
            OpDef::Prim(p) => p.specialize_as(UnaryTile(x, out)),
            OpDef::Composite(_) => unreachable!("`applies_f64` takes primitives only"),
        }
    }
    fn binary(op: BinaryOp, x: &[f64], y: &[f64], out: &mut [f64]) {
        match op.def() {
            OpDef::Prim(p) => p.specialize_as(BinaryTile(x, y, out)),
            OpDef::Composite(_) => unreachable!("`applies_f64` takes primitives only"),
        }
    }
    fn round(storage: Storage, x: &[f64], out: &mut [f64]) {
        match storage {
            Storage::F32 => vmath::wide(|| out.iter_mut().zip(x).for_each(|(o, &x)| *o = f64::from(x as f32))),
            _ => out.copy_from_slice(x),
        }
    }
}

/// A kernel's input buffer, read in the kernel's type `T`.
pub(super) trait Source<T>: Sync {
    /// Every element, where the buffer holds `T` (read in place, not copied).
    fn whole(&self) -> Option<&[T]>;
    /// Elements `first..first + out.len()`, converted into `out`.
    fn widen(&self, first: usize, out: &mut [T]);
    /// Element `i`, converted.
    fn at(&self, i: usize) -> T;
    /// Asks for the cache lines of elements `range`.
    fn prefetch(&self, range: Range<usize>);
}

impl Source<f32> for Stored<'_> {
    fn whole(&self) -> Option<&[f32]> {
        match self {
            Stored::F32(b) => Some(b),
            _ => None,
        }
    }
    fn widen(&self, first: usize, out: &mut [f32]) {
        Stored::widen(self, first, out);
    }
    fn at(&self, i: usize) -> f32 {
        Stored::at(self, i)
    }
    fn prefetch(&self, range: Range<usize>) {
        match self {
            Stored::F32(b) => prefetch(&b[range]),
            Stored::F16(b) => prefetch(&b[range]),
            Stored::Bf16(b) => prefetch(&b[range]),
            Stored::Bool(b) => prefetch(&b[range]),
        }
    }
}

/// An `f64` kernel's buffers: `f64`s, and `bool` masks read as 0 and 1 (integers, which
/// [`applies_f64`] never meets, convert as `.to(f64)` does).
impl Source<f64> for Wide<'_> {
    fn whole(&self) -> Option<&[f64]> {
        match self {
            Wide::F64(b) => Some(b),
            _ => None,
        }
    }
    fn widen(&self, first: usize, out: &mut [f64]) {
        let range = first..first + out.len();
        match self {
            Wide::F64(b) => out.copy_from_slice(&b[range]),
            Wide::I64(b) => out.iter_mut().zip(&b[range]).for_each(|(o, &x)| *o = x as f64),
            Wide::I32(b) => out.iter_mut().zip(&b[range]).for_each(|(o, &x)| *o = f64::from(x)),
            Wide::Bool(b) => out.iter_mut().zip(&b[range]).for_each(|(o, &m)| *o = f64::from(u8::from(m))),
        }
    }
    fn at(&self, i: usize) -> f64 {
        match self {
            Wide::F64(b) => b[i],
            Wide::I64(b) => b[i] as f64,
            Wide::I32(b) => f64::from(b[i]),
            Wide::Bool(b) => f64::from(u8::from(b[i])),
        }
    }
    fn prefetch(&self, range: Range<usize>) {
        match self {
            Wide::F64(b) => prefetch(&b[range]),
            Wide::I64(b) => prefetch(&b[range]),
            Wide::I32(b) => prefetch(&b[range]),
            Wide::Bool(b) => prefetch(&b[range]),
        }
    }
}

/// An element type kernels store: how results computed in `T` are written into it.
pub(super) trait Store<T>: Send + Sized {
    fn write(tile: &[T], out: &mut [Self]);
}

impl Store<f32> for f32 {
    fn write(tile: &[f32], out: &mut [f32]) {
        out.copy_from_slice(tile);
    }
}

impl Store<f64> for f64 {
    fn write(tile: &[f64], out: &mut [f64]) {
        out.copy_from_slice(tile);
    }
}

/// A result not yet written ([`run_uninit`], [`run_f64`]).
impl<T: Copy + Send> Store<T> for MaybeUninit<T> {
    fn write(tile: &[T], out: &mut [Self]) {
        out.write_copy_of_slice(tile);
    }
}

impl Store<f32> for f16 {
    fn write(tile: &[f32], out: &mut [f16]) {
        f16::narrow(tile, out);
    }
}

impl Store<f32> for bf16 {
    fn write(tile: &[f32], out: &mut [bf16]) {
        bf16::narrow(tile, out);
    }
}

/// Nonzero (NaN too) is true, as `.to(bool)`.
impl<T: TileType> Store<T> for bool {
    fn write(tile: &[T], out: &mut [bool]) {
        out.iter_mut().zip(tile).for_each(|(o, &x)| *o = x != T::ZERO);
    }
}

/// A `bool` result not yet written.
impl<T: TileType> Store<T> for MaybeUninit<bool> {
    fn write(tile: &[T], out: &mut [Self]) {
        out.iter_mut().zip(tile).for_each(|(o, &x)| {
            o.write(x != T::ZERO);
        });
    }
}

/// Elements per tile: a tile of every node of a large kernel stays in the L2 cache, and a
/// tile is long enough that a node's loop and its dispatch cost little beside it.
const TILE: usize = 512;

/// How one input is read: every element in turn (row-major over the kernel's space, from
/// element 0), or one element broadcast to all.
#[derive(Clone, Copy)]
enum Read {
    Whole,
    One(usize),
}

/// Whether `k` has the shape tiles take: a plain map (no rows, no reduction) written
/// row-major from element 0, each input read whole or as one element.
fn is_plain_map(k: &MapKernel) -> bool {
    let dims = &k.shape[..];
    k.rows.is_empty()
        && k.reduce.is_none()
        && k.output.is_contiguous_over(dims)
        && k.inputs.iter().all(|a| a.is_contiguous_over(dims) || a.is_uniform_over(dims))
}

/// Whether `k` runs by tiles: a plain `f32` map ([`is_plain_map`]), primitive ops only, and
/// at least one costly op or `randn` (without one, the compiled loop is as fast) or, where `converts`
/// (a buffer holds halves or `bool`s), any op: compiled code reads and writes `f32` only, so
/// such buffers would be converted whole first, a pass over memory and a temporary each.
pub(super) fn applies(k: &MapKernel, converts: bool) -> bool {
    k.is_plain_f32()
        && is_plain_map(k)
        && k.nodes.iter().all(|n| match *n {
            Node::Unary(op, _) => matches!(op.def(), OpDef::Prim(_)),
            Node::Binary(op, _, _) => matches!(op.def(), OpDef::Prim(_)),
            Node::Reduce(..) | Node::Acc | Node::Round(..) => false,
            _ => true,
        })
        && (converts
            || k.nodes.iter().any(|n| matches!(*n, Node::Unary(op, _) if costly(op).is_some()))
            || draws_normal(k))
}

/// Whether `k` has a `randn` node, which a tile fills in vector lanes (`vmath::random_into`)
/// where compiled code would call the scalar generator for each element.
fn draws_normal(k: &MapKernel) -> bool {
    k.nodes.iter().any(|n| matches!(n, Node::Randn { .. }))
}

/// Whether the `f64` kernel `k` runs by tiles over buffers stored as `storage`: a plain map
/// ([`is_plain_map`]) over `f64`s and `bool`s, of inputs, constants, primitive ops, `where`
/// roundings through `f64` or `f32` and random numbers, with at least one of `f64`'s
/// transcendental functions or a `randn` (which the compiled kernel calls one element at a
/// time).
pub(super) fn applies_f64(k: &MapKernel, storage: &BufferStorage) -> bool {
    let held = |s: &Storage| matches!(s, Storage::F64 | Storage::Bool);
    k.compute == Compute::F64
        && is_plain_map(k)
        && storage.inputs.len() == k.inputs.len()
        && storage.inputs.iter().chain([&storage.output]).all(held)
        && k.nodes.iter().all(|n| match *n {
            Node::Unary(op, _) => matches!(op.def(), OpDef::Prim(_)),
            Node::Binary(op, _, _) => matches!(op.def(), OpDef::Prim(_)),
            Node::Round(s, _) => matches!(s, Storage::F64 | Storage::F32),
            Node::Input(_) | Node::Const(_) | Node::Const64(_) | Node::Select(..) => true,
            Node::Rand { .. } | Node::Randn { .. } => true,
            Node::Iota { .. } | Node::Reduce(..) | Node::Acc => false,
        })
        && (k
            .nodes
            .iter()
            .any(|n| matches!(*n, Node::Unary(op, _) if matches!(op.def(), OpDef::Prim(p) if vmath::is_costly_f64(p))))
            || draws_normal(k))
}

/// `vmath`'s slice function for a costly op.
fn costly(op: UnaryOp) -> Option<vmath::SliceFn> {
    match op.def() {
        OpDef::Prim(p) => vmath::slice_fn(p),
        OpDef::Composite(_) => None,
    }
}

/// Runs `k` ([`applies`]; bounds checked by the caller) over `inputs` into `out`, its tiles
/// split over the calling thread's pool when large; stops between tiles once `stop` says so.
pub(super) fn run(k: &MapKernel, inputs: &[Stored], out: StoredMut, stop: &(dyn Fn() -> bool + Sync)) {
    match out {
        StoredMut::F32(out) => run_into(k, inputs, out, stop),
        StoredMut::F16(out) => run_into(k, inputs, out, stop),
        StoredMut::Bf16(out) => run_into(k, inputs, out, stop),
        StoredMut::Bool(out) => run_into(k, inputs, out, stop),
    }
}

/// One elementwise op (`k`'s nodes: its inputs, then one primitive op) over buffers of
/// halves, eagerly: the interpreter's ops on `f16`/`bf16` run tile by tile as a fused
/// kernel does, each element widened, computed and rounded while in the cache. Widening
/// whole operands and rounding a whole result took three passes over memory and two
/// temporaries the size of the tensor in `f32` (an eager `bf16` op 5x the time of the same
/// op on `f32`). The same bits: the same `f32` functions between the same roundings.
pub(crate) fn eager(k: &MapKernel, inputs: &[Stored], out: StoredMut) {
    debug_assert!(k.numel() > 0 && k.nodes.iter().all(|n| !matches!(n, Node::Reduce(..) | Node::Acc)));
    run(k, inputs, out, &|| false);
}

/// [`run`] into an `f32` result not yet written: each tile is written once, so every element
/// is when this returns, unless `stop` said so first.
pub(super) fn run_uninit(
    k: &MapKernel,
    inputs: &[Stored],
    out: &mut [MaybeUninit<f32>],
    stop: &(dyn Fn() -> bool + Sync),
) {
    run_into(k, inputs, out, stop);
}

/// Runs the `f64` kernel `k` ([`applies_f64`]; bounds checked by the caller) over `inputs`
/// into the first elements of `out` (`f64`s or `bool`s not yet written), as [`run`] does.
pub(super) fn run_f64<O: Store<f64>>(k: &MapKernel, inputs: &[Wide], out: &mut [O], stop: &(dyn Fn() -> bool + Sync)) {
    run_into(k, inputs, out, stop);
}

fn run_into<T: TileType, S: Source<T>, O: Store<T>>(
    k: &MapKernel,
    inputs: &[S],
    out: &mut [O],
    stop: &(dyn Fn() -> bool + Sync),
) {
    let n = k.numel();
    if n == 0 {
        return;
    }
    let reads: Vec<Read> = k
        .inputs
        .iter()
        .map(|a| if a.is_contiguous_over(&k.shape) { Read::Whole } else { Read::One(a.offset as usize) })
        .collect();
    let tiles = n.div_ceil(TILE);
    let parts = threads::loop_parts(tiles, n);
    let per_part = tiles.div_ceil(parts.max(1)) * TILE;
    // Each part owns its chunk of the output; a mutex hands it over (taken once per part).
    let chunks: Vec<std::sync::Mutex<(usize, &mut [O])>> =
        out[..n].chunks_mut(per_part).enumerate().map(|(i, c)| std::sync::Mutex::new((i * per_part, c))).collect();
    threads::run_parts(chunks.len(), |p| {
        let mut guard = chunks[p].lock().unwrap_or_else(|e| e.into_inner());
        let (start, chunk) = &mut *guard;
        let width = TILE.min(n);
        let mut scratch = vec![T::ZERO; k.nodes.len() * width];
        // The rows of constants and broadcast inputs are the same in every tile: filled once.
        for (i, node) in k.nodes.iter().enumerate() {
            if let Some(v) = invariant(inputs, &reads, *node) {
                scratch[i * width..][..width].fill(v);
            }
        }
        for t in 0..chunk.len().div_ceil(TILE) {
            if stop() {
                return;
            }
            let (at, end, first) = (t * TILE, chunk.len().min((t + 1) * TILE), *start + t * TILE);
            prefetch_next(inputs, &reads, &chunk[end..], first + TILE, *start + chunk.len());
            let tile_out = &mut chunk[at..end];
            let last = tile(k, inputs, &reads, first, tile_out.len(), &mut scratch);
            O::write(last, tile_out);
        }
    });
}

/// Asks for the cache lines of the next tile (elements `first..first + TILE`, short of the
/// part's `end`) of the inputs read whole and of the output (`out`, from the next tile on)
/// while this one computes. A tile reads and writes only half a page of each buffer between
/// long stretches of arithmetic, too little for the hardware's prefetcher, which stops at
/// page boundaries: without these hints the tile waits on memory, and arithmetic and memory
/// times add up (the 8-op chain of `bench/fusion` took 40 ms with them apart, 29 ms with
/// them overlapped).
fn prefetch_next<T, S: Source<T>, O>(inputs: &[S], reads: &[Read], out: &[O], first: usize, end: usize) {
    if first >= end {
        return;
    }
    let range = first..end.min(first + TILE);
    prefetch(&out[..out.len().min(TILE)]);
    for (input, read) in inputs.iter().zip(reads) {
        if let Read::Whole = read {
            input.prefetch(range.clone());
        }
    }
}

/// Hints to bring every cache line of `s` in; never faults, reads nothing.
#[inline(always)]
fn prefetch<T>(s: &[T]) {
    let at = s.as_ptr().cast::<i8>();
    for offset in (0..std::mem::size_of_val(s)).step_by(64) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch has no architectural effect and cannot fault.
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.wrapping_add(offset));
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at.wrapping_add(offset);
    }
}

/// The value of every element of `node` where it is the same in every tile: a constant or
/// an input broadcast from one element.
fn invariant<T: TileType, S: Source<T>>(inputs: &[S], reads: &[Read], node: Node) -> Option<T> {
    match node {
        Node::Const(bits) => Some(T::from_f32(f32::from_bits(bits))),
        Node::Const64(bits) => Some(T::from_f64(f64::from_bits(bits))),
        Node::Input(n) => match reads[n as usize] {
            Read::One(at) => Some(inputs[n as usize].at(at)),
            Read::Whole => None,
        },
        _ => None,
    }
}

/// Elements `first..first + len` of the kernel, every node into its row of `scratch` (the
/// rows of [`invariant`] nodes are already filled); the last node's row. Each node's loop
/// is built for the host's widest vectors (`vmath::wide`): a loop per node, so each is
/// small enough for the compiler to inline into the wide function.
#[inline(always)]
fn tile<'s, T: TileType, S: Source<T>>(
    k: &MapKernel,
    inputs: &'s [S],
    reads: &[Read],
    first: usize,
    len: usize,
    scratch: &'s mut [T],
) -> &'s [T] {
    let width = scratch.len() / k.nodes.len();
    // A node that reads an input of the kernel's type whole is that input's slice, not a
    // copy of it.
    let direct = |n: usize| match k.nodes[n] {
        Node::Input(m) => match reads[m as usize] {
            Read::Whole => inputs[m as usize].whole().map(|b| &b[first..first + len]),
            Read::One(_) => None,
        },
        _ => None,
    };
    for (i, node) in k.nodes.iter().enumerate() {
        let (done, rest) = scratch.split_at_mut(i * width);
        let row = &done[..];
        let value = |n: u32| direct(n as usize).unwrap_or_else(|| &row[n as usize * width..][..len]);
        let dst = &mut rest[..len];
        match *node {
            Node::Input(n) => match reads[n as usize] {
                _ if direct(i).is_some() => {}
                Read::Whole => inputs[n as usize].widen(first, dst),
                Read::One(_) => {}
            },
            Node::Const(_) | Node::Const64(_) => {}
            Node::Iota { start, step } => {
                let (start, step) = (f64::from_bits(start), f64::from_bits(step));
                vmath::wide(|| {
                    for (j, d) in dst.iter_mut().enumerate() {
                        *d = T::from_f32((start + (first + j) as f64 * step) as f32);
                    }
                });
            }
            Node::Rand { seed } => vmath::random_into(RandomKind::Uniform, seed, first as u64, dst),
            Node::Randn { seed } => vmath::random_into(RandomKind::Normal, seed, first as u64, dst),
            Node::Unary(op, a) => T::unary(op, value(a), dst),
            Node::Binary(op, a, b) => T::binary(op, value(a), value(b), dst),
            Node::Round(storage, a) => T::round(storage, value(a), dst),
            Node::Select(c, t, f) => {
                let (c, t, f) = (value(c), value(t), value(f));
                vmath::wide(|| {
                    for (((d, &c), &t), &f) in dst.iter_mut().zip(c).zip(t).zip(f) {
                        *d = if c != T::ZERO { t } else { f };
                    }
                });
            }
            Node::Reduce(..) | Node::Acc => unreachable!("`applies` takes plain maps only"),
        }
    }
    let last = k.nodes.len() - 1;
    direct(last).unwrap_or(&scratch[last * width..][..len])
}

/// A unary op's loop over one tile.
struct UnaryTile<'a, T>(&'a [T], &'a mut [T]);

impl UnaryKernel<()> for UnaryTile<'_, f32> {
    fn call<F: Fn(f32) -> f32 + Copy + Send + Sync>(self, f: F) {
        let UnaryTile(x, out) = self;
        vmath::wide(|| {
            for (d, &x) in out.iter_mut().zip(x) {
                *d = f(x);
            }
        });
    }
}

impl UnaryKernelAs<f64, ()> for UnaryTile<'_, f64> {
    fn call<F: Fn(f64) -> f64 + Copy + Send + Sync>(self, f: F) {
        let UnaryTile(x, out) = self;
        vmath::wide(|| {
            for (d, &x) in out.iter_mut().zip(x) {
                *d = f(x);
            }
        });
    }
}

/// A binary op's loop over one tile.
struct BinaryTile<'a, T>(&'a [T], &'a [T], &'a mut [T]);

impl BinaryKernel<()> for BinaryTile<'_, f32> {
    fn call<F: Fn(f32, f32) -> f32 + Copy + Send + Sync>(self, f: F) {
        let BinaryTile(x, y, out) = self;
        vmath::wide(|| {
            for ((d, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *d = f(x, y);
            }
        });
    }
}

impl BinaryKernelAs<f64, ()> for BinaryTile<'_, f64> {
    fn call<F: Fn(f64, f64) -> f64 + Copy + Send + Sync>(self, f: F) {
        let BinaryTile(x, y, out) = self;
        vmath::wide(|| {
            for ((d, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *d = f(x, y);
            }
        });
    }
}
