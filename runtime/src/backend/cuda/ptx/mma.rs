//! The tensor-core matmul of two half-precision operands (`f16` or `bf16`, summed in `f32`):
//! a 128x128 tile per block of 4 warps (64x64 each; [`Tile`]), `mma.sync m16n8k16` fed by `ldmatrix`
//! from shared tiles that a multi-stage `cp.async` pipeline fills while earlier stages are
//! multiplied. An operand whose rows are contiguous and 16-byte aligned is copied by
//! `cp.async` in 16-byte chunks (zero-filled past the edges); any other (transposed, odd
//! sizes) is loaded element by element into the same tiles, so every shape is correct and
//! the common one is fast. The epilogue and the rounding store are the FMA matmul's.

use super::emit::{f32_imm, Emitter, Reg};
use super::matmul::{block_setup, check_sizes, grid, store, Block, Product};
use super::{PtxError, PtxKernel};
use gt_ir::kernel::{BufferStorage, MatMulKernel, Storage};

/// Depth of one stage (two `k16` steps).
const BK: usize = 32;
/// Shared rows are padded by 8 halves (16 bytes) so that the 8 rows one `ldmatrix` reads
/// fall in distinct banks.
const A_LD: usize = BK + 8;

/// The block and warp tiles and the pipeline's depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Block tile rows and columns.
    pub bm: usize,
    /// See `bm`.
    pub bn: usize,
    /// One warp's tile (multiples of 16).
    pub wm: usize,
    /// See `wm`.
    pub wn: usize,
    /// Stages in flight: one being multiplied while the next `stages - 1` load.
    pub stages: usize,
}

impl Default for Tile {
    /// 128x128 blocks of 4 warps of 64x64, 4 stages: the fastest of the tilings measured
    /// on an H100 at 4096^3 in bf16 (273 TFLOP/s; 8 warps of 64x32: 264; 128x256 and 256x128
    /// blocks of 64x64 warps, 3 stages: 261, 252; `bench/results/cuda-h100.txt`).
    fn default() -> Tile {
        Tile { bm: 128, bn: 128, wm: 64, wn: 64, stages: 4 }
    }
}

impl Tile {
    /// `GT_MMA_TILE=BMxBNxWMxWNxSTAGES` (a tuning knob for benchmarks), else the default.
    pub fn from_env() -> Tile {
        let parse = |v: &str| -> Option<Tile> {
            let n: Vec<usize> = v.split('x').map(|p| p.parse().ok()).collect::<Option<_>>()?;
            let [bm, bn, wm, wn, stages] = n[..] else { return None };
            let t = Tile { bm, bn, wm, wn, stages };
            t.valid().then_some(t)
        };
        std::env::var("GT_MMA_TILE").ok().and_then(|v| parse(&v)).unwrap_or_default()
    }

    /// Whether the loads divide evenly among the threads and the warps tile the block.
    fn valid(self) -> bool {
        let warps_ok = self.wm.is_multiple_of(16)
            && self.wn.is_multiple_of(16)
            && self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn);
        warps_ok && (2..=8).contains(&self.stages) && {
            let t = self.threads();
            (64..=512).contains(&t)
                && (self.bm * BK / 8).is_multiple_of(t)
                && (self.bn * BK / 8).is_multiple_of(t)
                && self.shared_bytes() <= 200 << 10
        }
    }

    fn threads(self) -> usize {
        (self.bm / self.wm) * (self.bn / self.wn) * 32
    }

    fn b_ld(self) -> usize {
        self.bn + 8
    }

    fn a_bytes(self) -> usize {
        self.bm * A_LD * 2
    }

    fn stage_bytes(self) -> usize {
        self.a_bytes() + BK * self.b_ld() * 2
    }

    /// Dynamic shared memory of the pipelined kernel, in bytes.
    pub fn shared_bytes(self) -> usize {
        self.stages * self.stage_bytes()
    }
}

/// Whether this kernel runs on tensor cores: both operands stored in the same half type.
pub(super) fn applies(k: &MatMulKernel, storage: &BufferStorage) -> bool {
    let _ = k;
    storage.inputs[0].is_half() && storage.inputs[0] == storage.inputs[1]
}

pub(super) fn matmul(k: &MatMulKernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    check_sizes(k)?;
    let t = Tile::from_env();
    let half = storage.inputs[0];
    let mut e = Emitter::new(storage);
    let block = block_setup(&mut e, k, t.bm, t.bn);
    let nb = k.batch.len();
    let (a_plan, b_plan) = (Plan::lhs(k), Plan::rhs(k));
    let smem = e.value(Reg::B32, "mov.u32", "gt_smem");
    let a_loads = operand_loads(&mut e, k, t, &block, Operand::A, a_plan);
    let b_loads = operand_loads(&mut e, k, t, &block, Operand::B, b_plan);
    let (products, frag) = fragments(&mut e, t, &block.tid);
    let acc: Vec<String> = products.iter().map(|p| p.acc.clone()).collect();
    for a in &acc {
        e.op(format!("mov.f32 {a}, {}", f32_imm(0.0)));
    }
    let k_steps = [k.lhs.strides[nb + 1], k.rhs.strides[nb]];
    let (stages, stage_bytes, shared) = (t.stages, t.stage_bytes(), t.shared_bytes());

    // Prologue: the first stages - 1 stages in flight.
    let k0 = e.value(Reg::B32, "mov.s32", "0");
    let slot = e.reg(Reg::B32);
    for s in 0..stages - 1 {
        e.op(format!("add.u32 {slot}, {smem}, {}", s * stage_bytes));
        load_stage(&mut e, k, &block, &a_loads, &slot, &k0, k_steps[0]);
        load_stage(&mut e, k, &block, &b_loads, &slot, &k0, k_steps[1]);
        e.op("cp.async.commit_group");
        e.op(format!("add.s32 {k0}, {k0}, {BK}"));
    }
    // Byte offsets of the stage being written and of the one being read.
    let write = e.value(Reg::B32, "mov.u32", &((stages - 1) * stage_bytes).to_string());
    let read = e.value(Reg::B32, "mov.u32", "0");
    let stage = e.value(Reg::B32, "mov.s32", "0");
    let ty = if half == Storage::F16 { "f16" } else { "bf16" };
    let (m_tiles, n_tiles) = (t.wm / 16, t.wn / 8);
    e.counted_loop(("stage", "stages_done"), &stage, k.k.div_ceil(BK), "1", |e| {
        // This stage's copies are done (at most stages - 2 newer groups pending), and every
        // warp is past the products of the stage about to be overwritten.
        e.op(format!("cp.async.wait_group {}", stages - 2));
        e.op("bar.sync 0");
        e.op(format!("add.u32 {slot}, {smem}, {write}"));
        load_stage(e, k, &block, &a_loads, &slot, &k0, k_steps[0]);
        load_stage(e, k, &block, &b_loads, &slot, &k0, k_steps[1]);
        e.op("cp.async.commit_group");
        e.op(format!("add.s32 {k0}, {k0}, {BK}"));
        let base = e.value(Reg::B32, "add.u32", &format!("{smem}, {read}"));
        let a_at = e.value(Reg::B32, "add.u32", &format!("{base}, {}", frag.a_lane));
        let b_at = e.value(Reg::B32, "add.u32", &format!("{base}, {}", frag.b_lane));
        for k16 in 0..BK / 16 {
            // A: 16x16 fragments (rows 16 mi of the warp's), one ldmatrix.x4 each.
            let a: Vec<Vec<String>> = (0..m_tiles)
                .map(|mi| {
                    let regs: Vec<String> = (0..4).map(|_| e.reg(Reg::B32)).collect();
                    let at = mi * 16 * A_LD * 2 + k16 * 16 * 2;
                    e.op(format!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}}}, [{a_at}+{at}]", regs.join(", ")));
                    regs
                })
                .collect();
            // B: one ldmatrix.x4.trans per two 8-column tiles, their (b0, b1).
            let mut b: Vec<Vec<String>> = Vec::new();
            for nj in 0..n_tiles / 2 {
                let regs: Vec<String> = (0..4).map(|_| e.reg(Reg::B32)).collect();
                let at = t.a_bytes() + k16 * 16 * t.b_ld() * 2 + nj * 16 * 2;
                e.op(format!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{}}}, [{b_at}+{at}]", regs.join(", ")));
                b.push(vec![regs[0].clone(), regs[1].clone()]);
                b.push(vec![regs[2].clone(), regs[3].clone()]);
            }
            for (mi, a) in a.iter().enumerate() {
                for (ni, b) in b.iter().enumerate() {
                    let first = (mi * n_tiles + ni) * 4;
                    let d = acc[first..first + 4].join(", ");
                    e.op(format!(
                        "mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{d}}}, {{{}}}, {{{}}}, {{{d}}}",
                        a.join(", "),
                        b.join(", ")
                    ));
                }
            }
        }
        // Next stages, wrapping around the ring.
        for r in [&write, &read] {
            e.op(format!("add.u32 {r}, {r}, {stage_bytes}"));
            let wrap = e.predicate("ge.u32", r, &shared.to_string());
            e.op(format!("@{wrap} sub.u32 {r}, {r}, {shared}"));
        }
    });
    // Stages past the end were zero fills; let them land before the block exits.
    e.op("cp.async.wait_all");
    store(&mut e, k, &block, &products);
    let globals = ".extern .shared .align 16 .b8 gt_smem[];\n\n";
    let comment = format!(
        "matmul {}x{}x{} (batch {}), {ty} tensor cores (mma.sync m16n8k16, ldmatrix), tile {}x{}x{BK}, \
         warps of {}x{}, {stages} stages, A by {}, B by {}, epilogue of {} nodes",
        k.m,
        k.n,
        k.k,
        k.batch_count(),
        t.bm,
        t.bn,
        t.wm,
        t.wn,
        a_plan.name(),
        b_plan.name(),
        k.epilogue.len()
    );
    let mut text = e.finish(&comment, globals, 3 + k.epilogue_inputs.len());
    // Two blocks per SM where the accumulators leave room: ptxas then keeps registers to
    // what that allows (the default tile uses 122 on sm_90, no spills; left free it took
    // 194, one block per SM). 64x64 warp tiles in 8 warps would spill at 128.
    let threads = t.threads();
    let blocks = if threads * (t.wm * t.wn / 32 + 60) * 2 <= 65_536 { 2 } else { 1 };
    text = text.replacen("\n)\n{", &format!("\n)\n.maxntid {threads}, 1, 1\n.minnctapersm {blocks}\n{{"), 1);
    Ok(PtxKernel { text, grid: grid(k, t.bm, t.bn)?, block: (threads as u32, 1, 1), shared: shared as u32 })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Operand {
    A,
    B,
}

/// How an operand's tile is loaded.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// 16-byte `cp.async` chunks along the tile's contiguous rows.
    Async,
    /// One element per load, threads along the operand's unit-stride axis (`true`: along
    /// the tile's fast axis: k for A, n for B).
    Elements { along_fast: bool },
}

impl Plan {
    /// A's tile rows run along k: chunks when k is contiguous and every row starts 16-byte
    /// aligned.
    fn lhs(k: &MatMulKernel) -> Plan {
        let nb = k.batch.len();
        let (sm, sk) = (k.lhs.strides[nb], k.lhs.strides[nb + 1]);
        let aligned = k.lhs.offset % 8 == 0 && k.lhs.strides[..nb].iter().all(|s| s % 8 == 0);
        if sk == 1 && sm % 8 == 0 && k.k.is_multiple_of(8) && aligned {
            Plan::Async
        } else {
            Plan::Elements { along_fast: sk == 1 || sm != 1 }
        }
    }

    /// B's tile rows run along n.
    fn rhs(k: &MatMulKernel) -> Plan {
        let nb = k.batch.len();
        let (sk, sn) = (k.rhs.strides[nb], k.rhs.strides[nb + 1]);
        let aligned = k.rhs.offset % 8 == 0 && k.rhs.strides[..nb].iter().all(|s| s % 8 == 0);
        if sn == 1 && sk % 8 == 0 && k.n.is_multiple_of(8) && aligned {
            Plan::Async
        } else {
            Plan::Elements { along_fast: sn == 1 || sk != 1 }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Plan::Async => "cp.async",
            Plan::Elements { .. } => "element loads",
        }
    }
}

/// One load of a stage by this thread: its fixed coordinate's part of the global offset,
/// whether that coordinate is in range, its k within the stage, its byte offset within a
/// stage's tile, and whether it is a 16-byte chunk (`cp.async`) or one element.
struct Load {
    operand: Operand,
    fixed: String,
    fixed_ok: String,
    kk: String,
    tile_byte: String,
    chunk: bool,
}

/// The loads this thread makes of each stage of operand `which`.
fn operand_loads(e: &mut Emitter, k: &MatMulKernel, t: Tile, block: &Block, which: Operand, plan: Plan) -> Vec<Load> {
    let nb = k.batch.len();
    let Block { tid, row0, col0, a_base, b_base, .. } = block;
    // (tile rows along the fixed axis, its stride, its bound, origin, base, shared layout).
    let threads = t.threads();
    let (fixed_len, fixed_stride, bound, origin, base, tile_start) = match which {
        Operand::A => (t.bm, k.lhs.strides[nb], k.m, row0, a_base, 0),
        Operand::B => (t.bn, k.rhs.strides[nb + 1], k.n, col0, b_base, t.a_bytes()),
    };
    let b_ld = t.b_ld();
    // Byte offset in the tile of (fixed, kk): A is [m][k] rows of A_LD, B is [k][n] rows of B_LD.
    let tile_byte = |e: &mut Emitter, fixed: &str, kk: &str| match which {
        Operand::A => {
            let r = e.value(Reg::B32, "mul.lo.u32", &format!("{fixed}, {}", A_LD * 2));
            let r = e.value(Reg::B32, "mad.lo.u32", &format!("{kk}, 2, {r}"));
            e.value(Reg::B32, "add.u32", &format!("{r}, {tile_start}"))
        }
        Operand::B => {
            let r = e.value(Reg::B32, "mul.lo.u32", &format!("{kk}, {}", b_ld * 2));
            let r = e.value(Reg::B32, "mad.lo.u32", &format!("{fixed}, 2, {r}"));
            e.value(Reg::B32, "add.u32", &format!("{r}, {tile_start}"))
        }
    };
    let mut loads = Vec::new();
    let mut add = |e: &mut Emitter, fixed_local: String, kk: String, chunk: bool| {
        let fixed = e.value(Reg::B32, "add.s32", &format!("{origin}, {fixed_local}"));
        let fixed_ok = e.predicate("lt.s32", &fixed, &bound.to_string());
        let byte = tile_byte(e, &fixed_local, &kk);
        let fixed_off = e.value(Reg::B32, "mad.lo.s32", &format!("{fixed}, {fixed_stride}, {base}"));
        loads.push(Load { operand: which, fixed: fixed_off, fixed_ok, kk, tile_byte: byte, chunk });
    };
    // Tile elements: fixed_len x BK; chunks of 8 along the tile's fast axis. Load j of
    // thread tid is item tid + threads j of the tile, `per_row` items to a row.
    let split = |e: &mut Emitter, per_row: usize, j: usize| -> (String, String) {
        let item = threads * j;
        if threads.is_multiple_of(per_row) {
            let inner = e.value(Reg::B32, "rem.u32", &format!("{tid}, {per_row}"));
            let outer = e.value(Reg::B32, "div.u32", &format!("{tid}, {per_row}"));
            let outer = e.value(Reg::B32, "add.u32", &format!("{outer}, {}", item / per_row));
            (inner, outer)
        } else {
            // Rows longer than the block: this load's row is a constant.
            let inner = e.value(Reg::B32, "add.u32", &format!("{tid}, {}", item % per_row));
            let outer = e.value(Reg::B32, "mov.u32", &(item / per_row).to_string());
            (inner, outer)
        }
    };
    match plan {
        Plan::Async => {
            // A rows run along k (BK / 8 chunks each), B rows along n (bn / 8 chunks each).
            let per_row = if which == Operand::A { BK / 8 } else { t.bn / 8 };
            for j in 0..fixed_len * BK / 8 / threads {
                let (chunk, row) = split(e, per_row, j);
                let first = e.value(Reg::B32, "shl.b32", &format!("{chunk}, 3"));
                match which {
                    Operand::A => add(e, row, first, true),
                    Operand::B => add(e, first, row, true),
                }
            }
        }
        Plan::Elements { along_fast } => {
            // Consecutive threads along the unit-stride axis, so the loads coalesce.
            let lanes_along_k = if which == Operand::A { along_fast } else { !along_fast };
            let per_row = if lanes_along_k { BK } else { fixed_len };
            for j in 0..fixed_len * BK / threads {
                let (inner, outer) = split(e, per_row, j);
                let (fixed, kk) = if lanes_along_k { (outer, inner) } else { (inner, outer) };
                add(e, fixed, kk, false);
            }
        }
    }
    loads
}

/// Issues this thread's loads of the stage starting at `k0` into the stage at shared
/// address `slot`: past k or the fixed bound, chunks are zero-filled and elements are 0.
fn load_stage(e: &mut Emitter, k: &MatMulKernel, block: &Block, loads: &[Load], slot: &str, k0: &str, k_stride: i64) {
    for l in loads {
        let kidx = e.value(Reg::B32, "add.s32", &format!("{k0}, {}", l.kk));
        let k_ok = e.predicate("lt.s32", &kidx, &k.k.to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{k_ok}, {}", l.fixed_ok));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{kidx}, {k_stride}, {}", l.fixed));
        // Out of range, read the buffer's first element instead (never outside it).
        let off = e.value(Reg::B32, "selp.b32", &format!("{off}, 0, {ok}"));
        let base = if l.operand == Operand::A { &block.a_ptr } else { &block.b_ptr };
        let addr = e.element_address(base, &off);
        let dst = e.value(Reg::B32, "add.u32", &format!("{slot}, {}", l.tile_byte));
        if l.chunk {
            let size = e.value(Reg::B32, "selp.u32", &format!("16, 0, {ok}"));
            e.op(format!("cp.async.cg.shared.global [{dst}], [{addr}], 16, {size}"));
        } else {
            let h = e.reg(Reg::B16);
            e.op(format!("mov.b16 {h}, 0"));
            e.op(format!("@{ok} ld.global.nc.b16 {h}, [{addr}]"));
            e.op(format!("st.shared.b16 [{dst}], {h}"));
        }
    }
}

/// Per-lane `ldmatrix` byte offsets (within a stage) of the warp's A and B fragments.
struct Fragments {
    a_lane: String,
    b_lane: String,
}

/// This thread's accumulators (its warp tile's 16x8 tiles, 4 each) with their places in the block
/// tile, and its `ldmatrix` row addresses.
fn fragments(e: &mut Emitter, t: Tile, tid: &str) -> (Vec<Product>, Fragments) {
    // Warp w owns a wm x wn tile, warps_n of them to a row of the block. With g = lane / 4
    // and q = lane % 4 (PTX ISA, m16n8k16 with 16-bit inputs): D d0..d3 = (g, 2q),
    // (g, 2q+1), (g+8, 2q), (g+8, 2q+1). ldmatrix.x4: lanes 8i..8i+7 give the row addresses
    // of matrix i; A's matrices are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7,
    // k 8-15), (rows 8-15, k 8-15) = a0..a3, and B's, transposed from [k][n], (k 0-7,
    // n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b0, b1 of two n-tiles.
    let lane = e.value(Reg::B32, "and.b32", &format!("{tid}, 31"));
    let warp = e.value(Reg::B32, "shr.u32", &format!("{tid}, 5"));
    let warps_n = t.bn / t.wn;
    let wm = e.value(Reg::B32, "div.u32", &format!("{warp}, {warps_n}"));
    let wm = e.value(Reg::B32, "mul.lo.u32", &format!("{wm}, {}", t.wm));
    let wn = e.value(Reg::B32, "rem.u32", &format!("{warp}, {warps_n}"));
    let wn = e.value(Reg::B32, "mul.lo.u32", &format!("{wn}, {}", t.wn));
    // The row a lane addresses within a 16-row fragment: lane % 8 + 8 ((lane / 8) % 2); the
    // 8-column half: lane / 16.
    let r8 = e.value(Reg::B32, "and.b32", &format!("{lane}, 7"));
    let hi = e.value(Reg::B32, "shr.u32", &format!("{lane}, 3"));
    let hi = e.value(Reg::B32, "and.b32", &format!("{hi}, 1"));
    let row = e.value(Reg::B32, "mad.lo.u32", &format!("{hi}, 8, {r8}"));
    let half = e.value(Reg::B32, "shr.u32", &format!("{lane}, 4"));
    // A: (wm + row, 8 half) in [m][A_LD].
    let a_row = e.value(Reg::B32, "add.u32", &format!("{wm}, {row}"));
    let a_lane = e.value(Reg::B32, "mul.lo.u32", &format!("{a_row}, {}", A_LD * 2));
    let a_lane = e.value(Reg::B32, "mad.lo.u32", &format!("{half}, 16, {a_lane}"));
    // B: (k row, wn + 8 half) in [k][B_LD].
    let b_lane = e.value(Reg::B32, "mul.lo.u32", &format!("{row}, {}", t.b_ld() * 2));
    let b_col = e.value(Reg::B32, "mad.lo.u32", &format!("{half}, 8, {wn}"));
    let b_lane = e.value(Reg::B32, "mad.lo.u32", &format!("{b_col}, 2, {b_lane}"));
    let g = e.value(Reg::B32, "shr.u32", &format!("{lane}, 2"));
    let q = e.value(Reg::B32, "and.b32", &format!("{lane}, 3"));
    let row_base = e.value(Reg::B32, "add.u32", &format!("{wm}, {g}"));
    let col_base = e.value(Reg::B32, "mad.lo.u32", &format!("{q}, 2, {wn}"));
    let mut products = Vec::new();
    for mi in 0..t.wm / 16 {
        for ni in 0..t.wn / 8 {
            for r in 0..4 {
                products.push(Product {
                    row: (row_base.clone(), mi * 16 + 8 * (r / 2)),
                    col: (col_base.clone(), ni * 8 + r % 2),
                    acc: e.reg(Reg::F32),
                });
            }
        }
    }
    (products, Fragments { a_lane, b_lane })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::kernel::{samples, Access, Kernel};

    fn ptx(k: &MatMulKernel, s: Storage) -> String {
        let storage = BufferStorage { output: s, inputs: vec![s; 2 + k.epilogue_inputs.len()] };
        let p = super::super::generate_stored(&Kernel::MatMul(k.clone()), &storage).unwrap();
        if let Some(dir) = std::env::var_os("GT_DUMP_PTX") {
            let name = format!("mma_{}x{}x{}_{s:?}.ptx", k.m, k.n, k.k);
            std::fs::write(std::path::Path::new(&dir).join(name), &p.text).unwrap();
        }
        assert_eq!((p.block, p.shared as usize), ((128, 1, 1), Tile::default().shared_bytes()));
        p.text
    }

    #[test]
    fn aligned_operands_load_by_cp_async_and_others_by_elements() {
        let Kernel::MatMul(mm) = samples::linear_relu(4096, 4096, 4096) else { unreachable!() };
        let text = ptx(&mm, Storage::Bf16);
        assert!(text.contains("A by cp.async, B by cp.async"), "{}", text.lines().next().unwrap());
        assert!(text.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        let mut t = mm.clone();
        t.rhs = Access { offset: 0, strides: vec![1, 4096] };
        t.k = 4095;
        t.lhs = Access { offset: 0, strides: vec![4095, 1] };
        let text = ptx(&t, Storage::F16);
        assert!(text.contains("A by element loads, B by element loads"), "{}", text.lines().next().unwrap());
        assert!(text.contains(".f32.f16.f16.f32"));
    }
}
