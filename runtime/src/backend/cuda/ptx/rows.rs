//! Row kernels: one block per row of a map with in-row reductions (softmax, layer norm) or a
//! final reduction. Each reduction is a phase over the row folded by the block (warp
//! shuffles, then shared memory); the row's elements stay in registers between phases when
//! they fit, else each phase re-reads them (four at a time where the layout allows).

use super::emit::{Emitter, Reg};
use super::math::{fold, identity, Leaf};
use super::{check, float32_only, pick, PtxError, PtxKernel};
use gt_ir::kernel::{Access, BufferStorage, Compute, MapKernel, Node};
use gt_ir::ReduceOp;

/// Elements per thread up to which a row kernel keeps its row in registers between phases.
/// Measured on an H100 (16384x16384 softmax): re-reading the row from cache in each phase
/// (0.85 ms, as fast as PyTorch) beats keeping 16 elements per thread in registers (1.38 ms,
/// the register pressure halves the blocks per SM), so only short rows are kept.
const ROW_CACHE: usize = 4;

/// One element of a row: its row index `r`, whether it exists (unrolled tails), and what
/// has been computed for it.
struct Element {
    r: String,
    valid: Option<String>,
    coords: Option<Vec<Option<String>>>,
    loads: Vec<Option<String>>,
    index: Option<String>,
    memo: Vec<Option<String>>,
}

/// The per-block facts of a row kernel.
struct RowKernel<'a> {
    k: &'a MapKernel,
    row_dims: Vec<usize>,
    row_strides: Vec<Vec<i64>>,
    in_ptrs: Vec<String>,
    in_bases: Vec<String>,
    index_base: String,
    index_strides: Vec<i64>,
    /// Elements per row.
    row_len: usize,
    /// Threads per block, and their warps.
    threads: u32,
    warps: u32,
    /// Whether each thread keeps its elements in registers across phases (unrolled).
    cached: bool,
    /// Elements per step of a looped phase: 4 (one v4 load each) or 1.
    width: usize,
    /// This thread (`%tid.x`), its lane and warp, and the block's shared partials.
    tid: String,
    lane: String,
    warp: String,
    shared: String,
    /// The output's address, this row's first element in it, and its strides along the row.
    out: String,
    out_base: String,
    out_row_strides: Vec<i64>,
}

impl RowKernel<'_> {
    fn element(&self, r: String, valid: Option<String>, reduced: &[(usize, String)]) -> Element {
        let mut memo = vec![None; self.k.nodes.len()];
        for (i, reg) in reduced {
            memo[*i] = Some(reg.clone());
        }
        Element { r, valid, coords: None, loads: vec![None; self.k.inputs.len()], index: None, memo }
    }

    /// The `width` consecutive elements of group `g` (element `g` when `width` is 1), with
    /// the inputs `target` needs loaded by one v4 load each.
    fn group(
        &self,
        e: &mut Emitter,
        g: &str,
        width: usize,
        target: usize,
        reduced: &[(usize, String)],
    ) -> Vec<Element> {
        if width == 1 {
            return vec![self.element(g.to_string(), None, reduced)];
        }
        let first = e.value(Reg::B32, "shl.b32", &format!("{g}, 2"));
        let mut els: Vec<Element> = (0..width)
            .map(|lane| {
                let r = e.value(Reg::B32, "add.s32", &format!("{first}, {lane}"));
                self.element(r, None, reduced)
            })
            .collect();
        let dims = &self.k.shape[..];
        for i in needed_inputs(&self.k.nodes, target, reduced) {
            if self.k.inputs[i].is_uniform_over(dims) {
                continue;
            }
            let off = e.value(Reg::B32, "add.s32", &format!("{}, {first}", self.in_bases[i]));
            let regs = e.load4(&self.in_ptrs[i], &off);
            for (el, r) in els.iter_mut().zip(regs) {
                el.loads[i] = Some(r);
            }
        }
        els
    }

    /// Node `target` at element `el`.
    fn value(&self, e: &mut Emitter, el: &mut Element, target: usize) -> String {
        let Element { r, valid, coords, loads, index, memo } = el;
        let mut leaf = |e: &mut Emitter, l: Leaf| -> String {
            let coords = coords.get_or_insert_with(|| e.coords(r, &self.row_dims)).clone();
            match l {
                Leaf::Input(i) => {
                    let i = i as usize;
                    if let Some(x) = &loads[i] {
                        return x.clone();
                    }
                    let part = e.dot(0, &coords, &self.row_strides[i]);
                    let off = e.value(Reg::B32, "add.s32", &format!("{}, {part}", self.in_bases[i]));
                    let x = match valid {
                        None => e.load(&self.in_ptrs[i], &off),
                        // Past the row's end (an unrolled tail): no load, a harmless 0.
                        Some(p) => e.load_if(Some(p), &self.in_ptrs[i], &off),
                    };
                    loads[i] = Some(x.clone());
                    x
                }
                Leaf::Index | Leaf::Acc => index
                    .get_or_insert_with(|| {
                        let part = e.dot(0, &coords, &self.index_strides);
                        e.value(Reg::B32, "add.s32", &format!("{}, {part}", self.index_base))
                    })
                    .clone(),
            }
        };
        e.eval(&self.k.nodes, target, memo, &mut leaf)
    }

    /// Folds node `target` over the row into a block-wide result in every thread.
    fn phase(
        &self,
        e: &mut Emitter,
        op: ReduceOp,
        target: usize,
        reduced: &[(usize, String)],
        elements: &mut [Element],
    ) -> String {
        let start = identity(e, op);
        let (kind, ty) = (e.num(), e.ty());
        let acc = e.value(kind, &format!("mov.{ty}"), &start);
        if self.cached {
            for el in elements.iter_mut() {
                let x = self.value(e, el, target);
                let folded = fold(e, op, &acc, &x);
                let valid = el.valid.clone().unwrap_or_default();
                e.op(format!("selp.{ty} {acc}, {folded}, {acc}, {valid}"));
            }
        } else {
            let r = e.value(Reg::B32, "mov.u32", &self.tid);
            e.counted_loop(("fold", "folded"), &r, self.row_len / self.width, &self.threads.to_string(), |e| {
                for mut el in self.group(e, &r, self.width, target, reduced) {
                    let x = self.value(e, &mut el, target);
                    let folded = fold(e, op, &acc, &x);
                    e.assign(&acc, &folded);
                }
            });
        }
        block_reduce(e, op, &acc, self.warps, &self.lane, &self.warp, &self.shared);
        if op == ReduceOp::Mean {
            // 0 / 0 makes the mean of nothing NaN, as in the interpreter (means are of floats).
            let n = e.imm(self.row_len as f64);
            e.op(format!("div.rn.{ty} {acc}, {acc}, {n}"));
        }
        acc
    }

    /// Writes the kernel's value at element `el` (guarded past the row's end).
    fn store(&self, e: &mut Emitter, el: &mut Element) {
        let x = self.value(e, el, self.k.nodes.len() - 1);
        let coords = el.coords.get_or_insert_with(|| e.coords(&el.r, &self.row_dims)).clone();
        let part = e.dot(0, &coords, &self.out_row_strides);
        let off = e.value(Reg::B32, "add.s32", &format!("{}, {part}", self.out_base));
        e.store(el.valid.as_deref(), &self.out, &off, &x);
    }

    /// Writes the row's outputs: the kept elements, or a loop over the row.
    fn store_row(&self, e: &mut Emitter, reduced: &[(usize, String)], elements: &mut [Element]) {
        let last = self.k.nodes.len() - 1;
        if self.cached {
            for el in elements {
                self.store(e, el);
            }
        } else {
            let r = e.value(Reg::B32, "mov.u32", &self.tid);
            e.counted_loop(("store", "stored"), &r, self.row_len / self.width, &self.threads.to_string(), |e| {
                if self.width == 4 {
                    // Four consecutive elements, one v4 store.
                    let mut values = Vec::new();
                    for mut el in self.group(e, &r, self.width, last, reduced) {
                        values.push(self.value(e, &mut el, last));
                    }
                    let first = e.value(Reg::B32, "shl.b32", &format!("{r}, 2"));
                    let off = e.value(Reg::B32, "add.s32", &format!("{}, {first}", self.out_base));
                    e.store4(&self.out, &off, &values);
                } else {
                    let mut el = self.element(r.clone(), None, reduced);
                    self.store(e, &mut el);
                }
            });
        }
    }
}

/// The inputs node `target` reads, through nodes not already computed (`reduced`).
fn needed_inputs(nodes: &[Node], target: usize, reduced: &[(usize, String)]) -> Vec<usize> {
    let mut seen = vec![false; nodes.len()];
    let mut stack = vec![target];
    let mut inputs = Vec::new();
    while let Some(n) = stack.pop() {
        if seen[n] || reduced.iter().any(|(i, _)| *i == n) {
            continue;
        }
        seen[n] = true;
        if let Node::Input(i) = nodes[n] {
            if !inputs.contains(&(i as usize)) {
                inputs.push(i as usize);
            }
        }
        stack.extend(nodes[n].operands().into_iter().map(|o| o as usize));
    }
    inputs
}

/// `x` (of the compute type) from lane `lane ^ shift` of the warp: one 32-bit shuffle, or
/// two for a 64-bit value.
fn shuffle(e: &mut Emitter, x: &str, shift: u32) -> String {
    let kind = e.num();
    if e.compute() == Compute::F32 {
        let bits = e.value(Reg::B32, "mov.b32", x);
        let other = e.value(Reg::B32, "shfl.sync.bfly.b32", &format!("{bits}, {shift}, 31, -1"));
        return e.value(kind, "mov.b32", &other);
    }
    let bits = e.value(Reg::B64, "mov.b64", x);
    let (lo, hi) = (e.reg(Reg::B32), e.reg(Reg::B32));
    e.op(format!("mov.b64 {{{lo}, {hi}}}, {bits}"));
    let lo = e.value(Reg::B32, "shfl.sync.bfly.b32", &format!("{lo}, {shift}, 31, -1"));
    let hi = e.value(Reg::B32, "shfl.sync.bfly.b32", &format!("{hi}, {shift}, 31, -1"));
    e.value(kind, "mov.b64", &format!("{{{lo}, {hi}}}"))
}

/// Bytes of one computed value in shared memory.
fn slot_bytes(e: &Emitter) -> u32 {
    e.compute().dtype().size_bytes() as u32
}

/// Combines every thread's `acc` of the block; afterwards every thread holds the result.
fn block_reduce(e: &mut Emitter, op: ReduceOp, acc: &str, warps: u32, lane: &str, warp: &str, shared: &str) {
    let (kind, ty, size) = (e.num(), e.ty(), slot_bytes(e));
    for shift in [16, 8, 4, 2, 1] {
        let other = shuffle(e, acc, shift);
        let folded = fold(e, op, acc, &other);
        e.assign(acc, &folded);
    }
    if warps > 1 {
        let first_lane = e.predicate("eq.u32", lane, "0");
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{warp}, {size}, {shared}"));
        e.op(format!("@{first_lane} st.shared.{ty} [{slot}], {acc}"));
        e.op("bar.sync 0");
        // Every thread folds the partials in the same order: the same result everywhere.
        let start = identity(e, op);
        e.op(format!("mov.{ty} {acc}, {start}"));
        for w in 0..warps {
            let t = e.value(kind, &format!("ld.shared.{ty}"), &format!("[{shared}+{}]", w * size));
            let folded = fold(e, op, acc, &t);
            e.assign(acc, &folded);
        }
        // The partials are read by all before the next reduction overwrites them.
        e.op("bar.sync 0");
    }
}

/// A kernel that owns rows: one block per row; each in-row reduction is a phase over the
/// row (its elements kept in registers when they fit), then the row's outputs are written,
/// or reduced to one value.
pub(super) fn rows(k: &MapKernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    check(k.numel())?;
    check(k.output.span(&k.shape))?;
    for a in &k.inputs {
        check(a.span(&k.shape))?;
    }
    let (outputs, row_len) = k.extents();
    let dims = &k.shape[..];
    let threads = (row_len / 8).next_power_of_two().clamp(32, 1024) as u32;
    let warps = threads / 32;
    let per = row_len.div_ceil(threads as usize);
    let reductions: Vec<usize> = (0..k.nodes.len()).filter(|&i| matches!(k.nodes[i], Node::Reduce(..))).collect();
    let cached = !reductions.is_empty() && per <= ROW_CACHE;
    // Looped rows along the last axis read (and write) 4 consecutive elements at a time
    // when every strided buffer has unit stride there and 16-byte aligned rows.
    let last_axis = dims.len().saturating_sub(1);
    let aligned = |a: &Access| {
        a.offset % 4 == 0 && (0..dims.len()).all(|i| i == last_axis || a.strides[i] % 4 == 0 || dims[i] == 1)
    };
    let unit = |a: &Access| a.is_uniform_over(dims) || (a.strides[last_axis] == 1 && aligned(a));
    let vector = !cached
        && float32_only(k, storage)
        && k.rows == [last_axis]
        && row_len.is_multiple_of(4)
        && k.inputs.iter().all(unit)
        && (k.reduce.is_some() || (k.output.strides[last_axis] == 1 && aligned(&k.output)));
    let width = if vector { 4 } else { 1 };
    let last = k.nodes.len() - 1;
    let kept_axes: Vec<usize> = (0..dims.len()).filter(|i| !k.rows.contains(i)).collect();
    let kept_dims: Vec<usize> = kept_axes.iter().map(|&i| dims[i]).collect();
    let full = gt_ir::kernel::row_major_strides(dims);

    let mut e = Emitter::new(storage);
    e.computing(k.compute);
    let (out, in_ptrs) = e.buffers(k.inputs.len());
    let row = e.special("%ctaid.x");
    let tid = e.special("%tid.x");
    let lane = e.value(Reg::B32, "and.b32", &format!("{tid}, 31"));
    let warp = e.value(Reg::B32, "shr.u32", &format!("{tid}, 5"));
    let shared = e.value(Reg::B32, "mov.u32", "gt_partials");
    let kept = e.coords(&row, &kept_dims);
    let in_bases = k.inputs.iter().map(|a| e.dot(a.offset, &kept, &pick(&a.strides, &kept_axes))).collect();
    let out_base = e.dot(k.output.offset, &kept, &pick(&k.output.strides, &kept_axes));
    let index_base = e.dot(0, &kept, &pick(&full, &kept_axes));
    let rk = RowKernel {
        k,
        row_dims: k.rows.iter().map(|&i| dims[i]).collect(),
        row_strides: k.inputs.iter().map(|a| pick(&a.strides, &k.rows)).collect(),
        in_ptrs,
        in_bases,
        index_base,
        index_strides: pick(&full, &k.rows),
        row_len,
        threads,
        warps,
        cached,
        width,
        tid,
        lane,
        warp,
        shared,
        out,
        out_base,
        out_row_strides: pick(&k.output.strides, &k.rows),
    };

    // Cached: this thread's elements tid + j * threads, unrolled, kept across phases.
    let mut elements: Vec<Element> = Vec::new();
    if cached {
        for j in 0..per {
            let r = e.value(Reg::B32, "add.s32", &format!("{}, {}", rk.tid, j * threads as usize));
            let valid = e.predicate("lt.s32", &r, &row_len.to_string());
            elements.push(rk.element(r, Some(valid), &[]));
        }
    }
    let mut reduced: Vec<(usize, String)> = Vec::new();
    for &i in &reductions {
        let Node::Reduce(op, a) = k.nodes[i] else { continue };
        let result = rk.phase(&mut e, op, a as usize, &reduced, &mut elements);
        for el in &mut elements {
            el.memo[i] = Some(result.clone());
        }
        reduced.push((i, result));
    }
    let finish = e.label("finish");
    match k.reduce {
        Some(op) => {
            let acc = rk.phase(&mut e, op, last, &reduced, &mut elements);
            let not_first = e.predicate("ne.u32", &rk.tid, "0");
            e.op(format!("@{not_first} bra {finish}"));
            e.store(None, &rk.out, &rk.out_base, &acc);
        }
        None => rk.store_row(&mut e, &reduced, &mut elements),
    }
    e.place(&finish);
    let size = slot_bytes(&e);
    let globals = format!(".shared .align {size} .b8 gt_partials[{}];\n\n", warps * size);
    let comment = format!(
        "rows: {outputs} rows of {row_len}, {threads} threads per row, {} in-row reductions{}{}",
        reductions.len(),
        k.reduce.map(|op| format!(", then {}", op.mnemonic())).unwrap_or_default(),
        if cached {
            ", row kept in registers"
        } else if vector {
            ", 4 elements per load"
        } else {
            ""
        }
    );
    Ok(PtxKernel {
        text: e.finish(&comment, &globals, k.inputs.len() + 1),
        grid: (outputs as u32, 1, 1),
        block: (threads, 1, 1),
        shared: 0,
    })
}
