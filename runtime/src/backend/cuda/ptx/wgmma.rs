//! Hopper's warpgroup matmul (`wgmma.mma_async`, `sm_90a` only) for two operands of the same
//! half type, or TF32, whose rows are contiguous and 16-byte aligned: A row-major (k
//! fastest), B either row-major (n fastest, `wgmma`'s "N-major" B; halves only) or k fastest
//! (a transposed B, "K-major"; what TF32 needs: [`transposed_rhs`] makes one). Each warpgroup
//! (4 warps) multiplies 64 or 128 rows by the block's `bn` columns, 32 bytes of depth per
//! instruction (16 halves, 8 TF32), reading both operands straight from shared memory
//! through matrix descriptors; the accumulators stay in registers, laid out as `mma.sync`'s,
//! so the FMA matmul's epilogue and rounding store ([`store`]) finish the job. Shared tiles
//! are in the 128-byte swizzle (16-byte chunk `c` of 128-byte row `r` at chunk `c ^ (r % 8)`),
//! filled 16 bytes at a time by `cp.async` from every thread, `stages - 2` stages ahead,
//! while one batch of `wgmma` stays in flight. Other operands (odd sizes, a transposed A) and
//! other GPUs take `mma.rs`.

use super::emit::{f32_imm, Emitter, Reg};
use super::matmul::{block_setup, check_sizes, grid, store, Block, Product};
use super::mma::{inputs_of, load_stage, Inputs, Loads, Operand, Plan};
use super::{PtxError, PtxKernel};
use gt_ir::kernel::{
    row_major_strides, Access, BufferStorage, Compute, Kernel, MapKernel, MatMulKernel, Node, Storage,
};

/// A swizzled row (the swizzle's width), in bytes; 8 rows make the swizzle's 1024-byte atom.
const ROW: usize = 128;
const ATOM: usize = 8 * ROW;
/// Shared memory one block may have on an H100 (227 KiB).
const MAX_SHARED: usize = 227 << 10;

/// The block tile and the pipeline's depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgTile {
    /// Block tile rows: 64 per warpgroup part, at most two warpgroups.
    pub bm: usize,
    /// Block tile columns: the `n` of one `wgmma` (64, 128 or 256).
    pub bn: usize,
    /// Stages in the shared ring: `stages - 2` loading while one is multiplied and the
    /// one before may still be read by the `wgmma` in flight.
    pub stages: usize,
}

/// How B lies in memory, so in its shared tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BMajor {
    /// Row-major `[k][n]`: tiles of 64 columns, each 64 swizzled rows of 128 bytes.
    N,
    /// k fastest (a transposed `[n][k]`): `bn` swizzled rows of 128 bytes, as A's.
    K,
}

/// What one kernel multiplies: the operands' type and B's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Operands {
    inputs: Inputs,
    b: BMajor,
}

impl Operands {
    /// Elements in a 128-byte row: one stage's depth.
    fn bk(self) -> usize {
        ROW / self.inputs.elem()
    }
}

impl WgTile {
    /// 128x256 blocks (two warpgroups of 64x256) when the product has enough of them to fill
    /// an H100's 132 SMs, else 128x128 so that more blocks share the work. Measured on an
    /// H100 at 4096^3 in bf16 (`bench/results/cuda-h100.txt`): 128x256 and 256x128 with 4
    /// stages 523 and 525 TFLOP/s, with 3 stages 445 and 451; 128x128 441 (6 stages 458).
    fn default_for(m: usize, n: usize) -> WgTile {
        if m.div_ceil(128) * n.div_ceil(256) >= 132 {
            WgTile { bm: 128, bn: 256, stages: 4 }
        } else {
            WgTile { bm: 128, bn: 128, stages: 4 }
        }
    }

    /// `GT_WGMMA_TILE=BMxBNxSTAGES` (a tuning knob for benchmarks), else the default.
    fn from_env(m: usize, n: usize) -> WgTile {
        let parse = |v: &str| -> Option<WgTile> {
            let n: Vec<usize> = v.split('x').map(|p| p.parse().ok()).collect::<Option<_>>()?;
            let [bm, bn, stages] = n[..] else { return None };
            let t = WgTile { bm, bn, stages };
            t.valid().then_some(t)
        };
        std::env::var("GT_WGMMA_TILE").ok().and_then(|v| parse(&v)).unwrap_or(WgTile::default_for(m, n))
    }

    /// Whether these tiles suit B laid out as `b`: an N-major B's loads keep each thread's
    /// swizzle the same for all of them when threads >= bn.
    fn suits(self, b: BMajor) -> bool {
        b == BMajor::K || self.threads() >= self.bn
    }

    fn warpgroups(self) -> usize {
        (self.bm / 64).min(2)
    }

    /// 64-row parts per warpgroup (one `wgmma` each per 16 of depth).
    fn parts(self) -> usize {
        self.bm / 64 / self.warpgroups()
    }

    fn threads(self) -> usize {
        128 * self.warpgroups()
    }

    /// Whether the warpgroups tile the block, the loads divide among the threads, and the
    /// accumulators and stages fit ([`WgTile::suits`] checks B's loads).
    fn valid(self) -> bool {
        let parts_ok = self.bm.is_multiple_of(64) && matches!(self.bm / 64, 1 | 2 | 4);
        parts_ok
            && matches!(self.bn, 64 | 128 | 256)
            && (3..=8).contains(&self.stages)
            && self.parts() * self.bn / 2 <= 128
            && self.shared_bytes() <= MAX_SHARED
    }

    /// A's tile: `bm` swizzled rows of one stage's depth.
    fn a_bytes(self) -> usize {
        self.bm * ROW
    }

    /// B's tile, either way round: `bn` columns of one stage's depth.
    fn b_bytes(self) -> usize {
        self.bn * ROW
    }

    fn stage_bytes(self) -> usize {
        self.a_bytes() + self.b_bytes()
    }

    /// Dynamic shared memory: the stages, and room to align them to the swizzle's 1024 bytes.
    fn shared_bytes(self) -> usize {
        self.stages * self.stage_bytes() + ATOM
    }
}

/// What this matmul multiplies here, if it runs here: two halves of one type or TF32, A's
/// rows contiguous and aligned along k, B's along n (halves) or k.
fn operands(k: &MatMulKernel, storage: &BufferStorage) -> Option<Operands> {
    let inputs = inputs_of(k, storage)?;
    if Plan::lhs(k, inputs) != Plan::Async {
        return None;
    }
    let b = if k_major_rhs(k, inputs) {
        BMajor::K
    } else if matches!(inputs, Inputs::Half(_)) && Plan::rhs(k, inputs) == Plan::Async {
        BMajor::N
    } else {
        return None;
    };
    Some(Operands { inputs, b })
}

/// Whether this matmul runs here.
pub(super) fn applies(k: &MatMulKernel, storage: &BufferStorage) -> bool {
    operands(k, storage).is_some()
}

/// Whether B is read with k fastest, each of its n columns starting 16-byte aligned.
fn k_major_rhs(k: &MatMulKernel, inputs: Inputs) -> bool {
    let (nb, c) = (k.batch.len(), inputs.chunk() as i64);
    let b = &k.rhs;
    let aligned = b.offset % c == 0 && b.strides[..nb].iter().all(|s| s % c == 0);
    b.strides[nb] == 1 && b.strides[nb + 1] % c == 0 && k.k.is_multiple_of(inputs.chunk()) && aligned
}

/// A TF32 matmul whose B is row-major, run on Hopper as two kernels: B copied transposed
/// into a temporary (`elements` long, the `transpose` map), then the matmul reading it with
/// k fastest (`matmul`, its B buffer the temporary), which `wgmma` takes.
#[derive(Debug, Clone, PartialEq)]
pub struct TransposedRhs {
    /// `[batch.., n, k]` from B.
    pub transpose: Kernel,
    /// The matmul with B read from the transpose's output.
    pub matmul: Kernel,
    /// Elements of the temporary.
    pub elements: usize,
}

/// The two kernels a TF32 matmul with a row-major B runs as on Hopper, if it does.
pub(super) fn transposed_rhs(k: &MatMulKernel, storage: &BufferStorage) -> Option<TransposedRhs> {
    let tf32 = inputs_of(k, storage) == Some(Inputs::Tf32);
    if !tf32 || applies(k, storage) || Plan::rhs(k, Inputs::Tf32) != Plan::Async {
        return None;
    }
    let nb = k.batch.len();
    let b = &k.rhs;
    // Iterating over [batch.., n, k]: B's element (.., kk, nn) is at its strides swapped.
    let mut shape = k.batch.clone();
    shape.extend([k.n, k.k]);
    let mut strides = b.strides[..nb].to_vec();
    strides.extend([b.strides[nb + 1], b.strides[nb]]);
    let transpose = MapKernel {
        shape: shape.clone(),
        inputs: vec![Access { offset: b.offset, strides }],
        nodes: vec![Node::Input(0)],
        output: Access::contiguous(&shape),
        rows: vec![],
        reduce: None,
        compute: Compute::F32,
    };
    let mut matmul = k.clone();
    let mut strides = row_major_strides(&shape)[..nb].to_vec();
    strides.extend([1, k.k as i64]);
    matmul.rhs = Access { offset: 0, strides };
    let elements = shape.iter().product();
    let runs_here = applies(&matmul, storage);
    runs_here.then_some(TransposedRhs { transpose: Kernel::Map(transpose), matmul: Kernel::MatMul(matmul), elements })
}

/// The 64-bit shared-memory matrix descriptor of a 128-byte-swizzled operand, less its
/// address: leading byte offset (A: unused, 1; B: between 64-column blocks), stride byte
/// offset (8 rows: 1024), layout `SWIZZLE_128B` (bits 62-63 = 1). Offsets in 16-byte units.
fn descriptor_bits(leading: usize) -> u64 {
    ((leading as u64 >> 4) << 16) | ((ATOM as u64 >> 4) << 32) | (1u64 << 62)
}

pub(super) fn matmul(k: &MatMulKernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    check_sizes(k)?;
    let ops = operands(k, storage).expect("wgmma::applies was checked");
    let t = Some(WgTile::from_env(k.m, k.n)).filter(|t| t.suits(ops.b)).unwrap_or(WgTile::default_for(k.m, k.n));
    let bk = ops.bk();
    let mut e = Emitter::new(storage);
    e.target("8.0", "sm_90a");
    let block = block_setup(&mut e, k, t.bm, t.bn);
    let nb = k.batch.len();
    let raw = e.value(Reg::B32, "mov.u32", "gt_smem");
    let up = e.value(Reg::B32, "add.u32", &format!("{raw}, {}", ATOM - 1));
    let smem = e.value(Reg::B32, "and.b32", &format!("{up}, {}", !(ATOM as u32 - 1)));
    let a_loads = rows_loads(&mut e, k, (t, ops.inputs), &block, Operand::A);
    let b_loads = match ops.b {
        BMajor::K => rows_loads(&mut e, k, (t, ops.inputs), &block, Operand::B),
        BMajor::N => columns_loads(&mut e, k, t, &block),
    };
    let (products, a_warpgroup) = accumulators(&mut e, t, &block.tid);
    for p in &products {
        e.op(format!("mov.f32 {}, {}", p.acc, f32_imm(0.0)));
    }
    let acc: Vec<String> = products.iter().map(|p| p.acc.clone()).collect();
    let one = e.value(Reg::B32, "mov.u32", "1");
    let scale_d = e.predicate("ne.u32", &one, "0");
    let k_steps = [k.lhs.strides[nb + 1], k.rhs.strides[nb]];
    let (stages, stage_bytes) = (t.stages, t.stage_bytes());
    let ring = stages * stage_bytes;

    // Prologue: the first stages - 2 stages in flight.
    let k0 = e.value(Reg::B32, "mov.s32", "0");
    let slot = e.reg(Reg::B32);
    for s in 0..stages - 2 {
        e.op(format!("add.u32 {slot}, {smem}, {}", s * stage_bytes));
        load_stage(&mut e, k, (&block, 2), &a_loads, &slot, &k0, k_steps[0]);
        load_stage(&mut e, k, (&block, 2), &b_loads, &slot, &k0, k_steps[1]);
        e.op("cp.async.commit_group");
        e.op(format!("add.s32 {k0}, {k0}, {bk}"));
    }
    let write = e.value(Reg::B32, "mov.u32", &((stages - 2) * stage_bytes).to_string());
    let read = e.value(Reg::B32, "mov.u32", "0");
    let stage = e.value(Reg::B32, "mov.s32", "0");
    let (ty, depth) = match ops.inputs {
        Inputs::Half(Storage::F16) => ("f16", 16),
        Inputs::Half(_) => ("bf16", 16),
        Inputs::Tf32 => ("tf32", 8),
    };
    // B's leading byte offset: between its 64-column tiles when N-major (each `bk` rows).
    let b_bits = descriptor_bits(if ops.b == BMajor::N { bk * ROW } else { 16 });
    let a_bits = descriptor_bits(16);
    e.counted_loop(("stage", "stages_done"), &stage, k.k.div_ceil(bk), "1", |e| {
        // This stage's copies have landed (at most stages - 3 newer groups pending) and are
        // visible to the tensor cores' reads (the async proxy); every warpgroup is past the
        // wgmma of two stages ago, whose slot the next loads overwrite.
        e.op(format!("cp.async.wait_group {}", stages - 3));
        e.op("fence.proxy.async.shared::cta");
        e.op("bar.sync 0");
        e.op(format!("add.u32 {slot}, {smem}, {write}"));
        load_stage(e, k, (&block, 2), &a_loads, &slot, &k0, k_steps[0]);
        load_stage(e, k, (&block, 2), &b_loads, &slot, &k0, k_steps[1]);
        e.op("cp.async.commit_group");
        e.op(format!("add.s32 {k0}, {k0}, {bk}"));
        // Descriptors of this stage's tiles: this warpgroup's rows of A, all of B.
        let here = e.value(Reg::B32, "add.u32", &format!("{smem}, {read}"));
        let descriptor = |e: &mut Emitter, at: &str, bits: u64| {
            let units = e.value(Reg::B32, "shr.u32", &format!("{at}, 4"));
            let wide = e.value(Reg::B64, "cvt.u64.u32", &units);
            e.value(Reg::B64, "or.b64", &format!("{wide}, {bits}"))
        };
        let a_at = e.value(Reg::B32, "add.u32", &format!("{here}, {a_warpgroup}"));
        let a_desc = descriptor(e, &a_at, a_bits);
        let b_at = e.value(Reg::B32, "add.u32", &format!("{here}, {}", t.a_bytes()));
        let b_desc = descriptor(e, &b_at, b_bits);
        e.op("wgmma.fence.sync.aligned");
        let per_part = t.bn / 2;
        // Halves name their layouts (A K-major: 0; B: 1 when N-major); TF32 is K-major only.
        let layouts = match (ops.inputs, ops.b) {
            (Inputs::Tf32, _) => "",
            (_, BMajor::N) => ", 0, 1",
            (_, BMajor::K) => ", 0, 0",
        };
        for kk in 0..ROW / 32 {
            // 32 bytes deeper: along the swizzled rows (A, a K-major B), or `depth` rows
            // (2 atoms) down an N-major B.
            let b_step = if ops.b == BMajor::N { kk * depth * ROW } else { kk * 32 };
            let b = e.value(Reg::B64, "add.s64", &format!("{b_desc}, {}", b_step / 16));
            for part in 0..t.parts() {
                let a = e.value(Reg::B64, "add.s64", &format!("{a_desc}, {}", (part * 64 * ROW + kk * 32) / 16));
                let d = acc[part * per_part..(part + 1) * per_part].join(", ");
                e.op(format!(
                    "wgmma.mma_async.sync.aligned.m64n{}k{depth}.f32.{ty}.{ty} {{{d}}}, {a}, {b}, {scale_d}, 1, 1{layouts}",
                    t.bn
                ));
            }
        }
        e.op("wgmma.commit_group.sync.aligned");
        e.op("wgmma.wait_group.sync.aligned 1");
        for r in [&write, &read] {
            e.op(format!("add.u32 {r}, {r}, {stage_bytes}"));
            let wrap = e.predicate("ge.u32", r, &ring.to_string());
            e.op(format!("@{wrap} sub.u32 {r}, {r}, {ring}"));
        }
    });
    e.op("wgmma.wait_group.sync.aligned 0");
    // Stages past the end were zero fills; let them land before the block exits.
    e.op("cp.async.wait_all");
    store(&mut e, k, &block, &products);
    let globals = ".extern .shared .align 1024 .b8 gt_smem[];\n\n";
    let comment = format!(
        "matmul {}x{}x{} (batch {}), {ty} warpgroup tensor cores (wgmma m64n{}k{depth}, 128-byte swizzle), \
         tile {}x{}x{bk}, {} warpgroup(s), {stages} stages, B {}-major, epilogue of {} nodes",
        k.m,
        k.n,
        k.k,
        k.batch_count(),
        t.bn,
        t.bm,
        t.bn,
        t.warpgroups(),
        if ops.b == BMajor::N { "N" } else { "K" },
        k.epilogue.len()
    );
    e.launch_bounds(t.threads(), 1);
    let text = e.finish(&comment, globals, 3 + k.epilogue_inputs.len());
    Ok(PtxKernel {
        text,
        grid: grid(k, t.bm, t.bn)?,
        block: (t.threads() as u32, 1, 1),
        shared: t.shared_bytes() as u32,
    })
}

/// This thread's `cp.async` chunks of a stage of an operand whose tile rows run along k (A,
/// or a K-major B): thread `tid` copies chunk `tid % 8` of rows `tid / 8 + j threads / 8`;
/// as that step is a multiple of 8 rows, the swizzled place differs between them by whole
/// rows only.
fn rows_loads(
    e: &mut Emitter,
    k: &MatMulKernel,
    (t, inputs): (WgTile, Inputs),
    block: &Block,
    which: Operand,
) -> Loads {
    let nb = k.batch.len();
    let Block { tid, row0, col0, a_base, b_base, .. } = block;
    let (origin, base, fixed_stride, bound, rows, start) = match which {
        Operand::A => (row0, a_base, k.lhs.strides[nb], k.m, t.bm, 0),
        Operand::B => (col0, b_base, k.rhs.strides[nb + 1], k.n, t.bn, t.a_bytes()),
    };
    let threads = t.threads();
    let row = e.value(Reg::B32, "shr.u32", &format!("{tid}, 3"));
    let chunk = e.value(Reg::B32, "and.b32", &format!("{tid}, 7"));
    let fixed = e.value(Reg::B32, "add.s32", &format!("{origin}, {row}"));
    let fixed_off = e.value(Reg::B32, "mad.lo.s32", &format!("{fixed}, {fixed_stride}, {base}"));
    let kk = e.value(Reg::B32, "mul.lo.u32", &format!("{chunk}, {}", inputs.chunk()));
    let tile = swizzled(e, &row, &chunk);
    let tile = e.value(Reg::B32, "add.u32", &format!("{tile}, {start}"));
    let rows_per_load = threads / 8;
    let offsets = (0..rows / rows_per_load).map(|j| (j * rows_per_load, 0, j * rows_per_load * ROW)).collect();
    Loads { operand: which, chunk: true, fixed, fixed_off, kk, tile, fixed_stride, bound, offsets }
}

/// This thread's chunks of a row-major B's stage (halves, 64 rows): chunk `tid % (bn / 8)`
/// of k rows `tid / (bn / 8) + j threads / (bn / 8)` (a multiple of 8 rows apart, as
/// `threads >= bn`), in column tile `chunk / 8` (each 64 rows of 128 bytes).
fn columns_loads(e: &mut Emitter, k: &MatMulKernel, t: WgTile, block: &Block) -> Loads {
    const BK: usize = 64;
    let nb = k.batch.len();
    let Block { tid, col0, b_base, .. } = block;
    let (threads, per_row) = (t.threads(), t.bn / 8);
    let shift = per_row.trailing_zeros();
    let krow = e.value(Reg::B32, "shr.u32", &format!("{tid}, {shift}"));
    let column = e.value(Reg::B32, "and.b32", &format!("{tid}, {}", per_row - 1));
    let first = e.value(Reg::B32, "shl.b32", &format!("{column}, 3"));
    let fixed = e.value(Reg::B32, "add.s32", &format!("{col0}, {first}"));
    let fixed_stride = k.rhs.strides[nb + 1];
    let fixed_off = e.value(Reg::B32, "mad.lo.s32", &format!("{fixed}, {fixed_stride}, {b_base}"));
    let chunk = e.value(Reg::B32, "and.b32", &format!("{column}, 7"));
    let cblock = e.value(Reg::B32, "shr.u32", &format!("{column}, 3"));
    let start = e.value(Reg::B32, "mul.lo.u32", &format!("{cblock}, {}", BK * ROW));
    let start = e.value(Reg::B32, "add.u32", &format!("{start}, {}", t.a_bytes()));
    let tile = swizzled(e, &krow, &chunk);
    let tile = e.value(Reg::B32, "add.u32", &format!("{tile}, {start}"));
    let rows_per_load = threads / per_row;
    let offsets = (0..BK / rows_per_load).map(|j| (0, j * rows_per_load, j * rows_per_load * ROW)).collect();
    Loads { operand: Operand::B, chunk: true, fixed, fixed_off, kk: krow, tile, fixed_stride, bound: k.n, offsets }
}

/// The byte offset of 16-byte `chunk` of swizzled `row`: `row * 128 + (chunk ^ row % 8) * 16`.
fn swizzled(e: &mut Emitter, row: &str, chunk: &str) -> String {
    let phase = e.value(Reg::B32, "and.b32", &format!("{row}, 7"));
    let place = e.value(Reg::B32, "xor.b32", &format!("{chunk}, {phase}"));
    let at = e.value(Reg::B32, "mul.lo.u32", &format!("{row}, {ROW}"));
    e.value(Reg::B32, "mad.lo.u32", &format!("{place}, 16, {at}"))
}

/// This thread's accumulators with their places in the block tile, and the byte offset of
/// its warpgroup's rows in A's tile. PTX ISA, `wgmma .m64nNk16` with `f32` results: warp `w`
/// of the warpgroup holds rows `16 w ..`, and with `g = lane / 4`, `q = lane % 4`, its
/// register `i` is row `g + 8 (i / 2 % 2)`, column `8 (i / 4) + 2 q + i % 2`.
fn accumulators(e: &mut Emitter, t: WgTile, tid: &str) -> (Vec<Product>, String) {
    let warpgroup = e.value(Reg::B32, "shr.u32", &format!("{tid}, 7"));
    let warp = e.value(Reg::B32, "shr.u32", &format!("{tid}, 5"));
    let warp = e.value(Reg::B32, "and.b32", &format!("{warp}, 3"));
    let lane = e.value(Reg::B32, "and.b32", &format!("{tid}, 31"));
    let g = e.value(Reg::B32, "shr.u32", &format!("{lane}, 2"));
    let q = e.value(Reg::B32, "and.b32", &format!("{lane}, 3"));
    let first_row = e.value(Reg::B32, "mul.lo.u32", &format!("{warpgroup}, {}", t.parts() * 64));
    let a_warpgroup = e.value(Reg::B32, "mul.lo.u32", &format!("{first_row}, {ROW}"));
    let row_base = e.value(Reg::B32, "mad.lo.u32", &format!("{warp}, 16, {first_row}"));
    let row_base = e.value(Reg::B32, "add.u32", &format!("{row_base}, {g}"));
    let col_base = e.value(Reg::B32, "shl.b32", &format!("{q}, 1"));
    let mut products = Vec::new();
    for part in 0..t.parts() {
        for i in 0..t.bn / 2 {
            products.push(Product {
                row: (row_base.clone(), part * 64 + 8 * (i / 2 % 2)),
                col: (col_base.clone(), 8 * (i / 4) + i % 2),
                acc: e.reg(Reg::F32),
            });
        }
    }
    (products, a_warpgroup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::ptx::{generate_for, Target};
    use gt_ir::kernel::{samples, Access, Kernel};

    fn halves(k: &MatMulKernel, s: Storage) -> BufferStorage {
        BufferStorage { output: s, inputs: vec![s; 2 + k.epilogue_inputs.len()] }
    }

    #[test]
    fn aligned_half_matmuls_run_on_warpgroups_on_hopper_only() {
        let Kernel::MatMul(mm) = samples::linear_relu(4096, 4096, 4096) else { unreachable!() };
        let kernel = Kernel::MatMul(mm.clone());
        let hopper = generate_for(&kernel, &halves(&mm, Storage::Bf16), Target::Sm90a).unwrap();
        let head = hopper.text.lines().next().unwrap().to_string();
        assert!(
            head.contains("bf16 warpgroup tensor cores (wgmma m64n256k16") && head.contains("tile 128x256x64"),
            "{head}"
        );
        assert!(hopper.text.contains(".target sm_90a") && hopper.text.contains("fence.proxy.async.shared::cta"));
        assert_eq!((hopper.block, hopper.shared as usize), ((256, 1, 1), 4 * (128 * 128 + 64 * 512) + 1024));
        assert_eq!(hopper.grid, (16, 32, 1));
        // Ampere code, and f32 operands, take mma.sync; so does a B with odd column strides.
        let ampere = generate_for(&kernel, &halves(&mm, Storage::Bf16), Target::Sm80).unwrap();
        assert!(ampere.text.contains("mma.sync") && !ampere.text.contains("wgmma"));
        let f32s = generate_for(&kernel, &BufferStorage::f32(3), Target::Sm90a).unwrap();
        assert!(!f32s.text.contains("wgmma"));
        let mut t = mm.clone();
        t.rhs = Access { offset: 0, strides: vec![1, 4097] };
        let tk = Kernel::MatMul(t.clone());
        assert!(!generate_for(&tk, &halves(&t, Storage::F16), Target::Sm90a).unwrap().text.contains("wgmma"));
        // A smaller product gets 128-wide blocks.
        let Kernel::MatMul(small) = samples::linear_relu(512, 512, 512) else { unreachable!() };
        let text =
            generate_for(&Kernel::MatMul(small.clone()), &halves(&small, Storage::F16), Target::Sm90a).unwrap().text;
        assert!(text.contains(".f32.f16.f16") && text.contains("m64n128k16"), "{}", text.lines().next().unwrap());
    }

    #[test]
    fn tf32_with_a_row_major_b_is_transposed_first_then_runs_on_warpgroups() {
        let Kernel::MatMul(mut mm) = samples::linear_relu(4096, 1024, 2048) else { unreachable!() };
        mm.precision = gt_ir::kernel::Precision::Tf32;
        let (kernel, f32s) = (Kernel::MatMul(mm.clone()), BufferStorage::f32(3));
        assert_eq!(crate::backend::cuda::ptx::transposed_rhs(&kernel, &f32s, Target::Sm80), None);
        let t = crate::backend::cuda::ptx::transposed_rhs(&kernel, &f32s, Target::Sm90a).unwrap();
        assert_eq!(t.elements, 1024 * 2048);
        let Kernel::Map(transpose) = &t.transpose else { panic!("{:?}", t.transpose) };
        assert_eq!((transpose.shape.clone(), transpose.inputs[0].strides.clone()), (vec![2048, 1024], vec![1, 2048]));
        let text = generate_for(&t.matmul, &f32s, Target::Sm90a).unwrap().text;
        let head = text.lines().next().unwrap();
        assert!(head.contains("tf32 warpgroup tensor cores (wgmma m64n256k8") && head.contains("x32, "), "{head}");
        assert!(head.contains("B K-major") && text.contains(".f32.tf32.tf32"), "{head}");
        // The transpose is a tiled one, and f32 without TF32 stays off the tensor cores.
        let map = generate_for(&t.transpose, &BufferStorage::f32(1), Target::Sm90a).unwrap().text;
        assert!(map.lines().next().unwrap().contains("tiled transpose"));
        mm.precision = gt_ir::kernel::Precision::F32;
        assert_eq!(crate::backend::cuda::ptx::transposed_rhs(&Kernel::MatMul(mm), &f32s, Target::Sm90a), None);
    }

    #[test]
    fn halves_with_a_transposed_b_read_it_k_major() {
        let Kernel::MatMul(mut mm) = samples::linear_relu(1024, 512, 768) else { unreachable!() };
        mm.rhs = Access { offset: 0, strides: vec![1, 512] };
        let text = generate_for(&Kernel::MatMul(mm.clone()), &halves(&mm, Storage::Bf16), Target::Sm90a).unwrap().text;
        assert!(text.lines().next().unwrap().contains("B K-major"), "{}", text.lines().next().unwrap());
        assert!(text.contains(", 1, 1, 0, 0;"));
    }

    #[test]
    fn tiles_are_checked() {
        assert!(WgTile { bm: 128, bn: 256, stages: 4 }.valid());
        assert!(WgTile { bm: 256, bn: 128, stages: 4 }.valid());
        assert!(WgTile { bm: 64, bn: 128, stages: 6 }.valid());
        // Too many accumulators, B rows that would not keep their swizzle, too much memory.
        assert!(!WgTile { bm: 256, bn: 256, stages: 3 }.valid());
        let narrow = WgTile { bm: 64, bn: 256, stages: 4 };
        assert!(narrow.valid() && narrow.suits(BMajor::K) && !narrow.suits(BMajor::N));
        assert!(!WgTile { bm: 128, bn: 256, stages: 5 }.valid());
        assert!(!WgTile { bm: 96, bn: 128, stages: 4 }.valid());
    }

    #[test]
    fn descriptors_hold_offsets_in_16_byte_units_and_the_swizzle() {
        assert_eq!(descriptor_bits(16), (1 << 16) | (64 << 32) | (1 << 62));
        assert_eq!(descriptor_bits(8192), (512 << 16) | (64 << 32) | (1 << 62));
    }
}
