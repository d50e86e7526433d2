//! Hopper's warpgroup matmul (`wgmma.mma_async`, `sm_90a` only) for two operands of the same
//! half type whose rows are contiguous and 16-byte aligned: A row-major (k fastest), B
//! row-major (n fastest, `wgmma`'s "N-major" B). Each warpgroup (4 warps) multiplies 64 or
//! 128 rows by the block's `bn` columns, 16 deep per instruction, reading both operands
//! straight from shared memory through matrix descriptors; the accumulators stay in
//! registers, laid out as `mma.sync`'s, so the FMA matmul's epilogue and rounding store
//! ([`store`]) finish the job. Shared tiles are in the 128-byte swizzle (16-byte chunk `c` of
//! 128-byte row `r` at chunk `c ^ (r % 8)`), filled 16 bytes at a time by `cp.async` from
//! every thread, `stages - 2` stages ahead, while one batch of `wgmma` stays in flight.
//! Other operands (transposed, odd sizes) and other GPUs take `mma.rs`.

use super::emit::{f32_imm, Emitter, Reg};
use super::matmul::{block_setup, check_sizes, grid, store, Block, Product};
use super::mma::{inputs_of, load_stage, Inputs, Loads, Operand, Plan};
use super::{PtxError, PtxKernel};
use gt_ir::kernel::{BufferStorage, MatMulKernel, Storage};

/// Depth of one stage: 64 halves, one 128-byte swizzled row of A.
const BK: usize = 64;
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

    /// Whether the warpgroups tile the block, the loads divide among the threads keeping
    /// each thread's swizzle the same for all its loads (threads >= bn), and the
    /// accumulators and stages fit.
    fn valid(self) -> bool {
        let parts_ok = self.bm.is_multiple_of(64) && matches!(self.bm / 64, 1 | 2 | 4);
        parts_ok
            && matches!(self.bn, 64 | 128 | 256)
            && (3..=8).contains(&self.stages)
            && self.threads() >= self.bn
            && self.parts() * self.bn / 2 <= 128
            && self.shared_bytes() <= MAX_SHARED
    }

    /// A's tile: `bm` swizzled rows of `BK` halves.
    fn a_bytes(self) -> usize {
        self.bm * ROW
    }

    /// B's tile: `bn / 64` column blocks, each `BK` swizzled rows of 64 halves.
    fn b_bytes(self) -> usize {
        BK * self.bn * 2
    }

    fn stage_bytes(self) -> usize {
        self.a_bytes() + self.b_bytes()
    }

    /// Dynamic shared memory: the stages, and room to align them to the swizzle's 1024 bytes.
    fn shared_bytes(self) -> usize {
        self.stages * self.stage_bytes() + ATOM
    }
}

/// Whether this matmul runs here: two halves of one type, both operands' rows contiguous
/// and aligned (A along k, B along n), and `GT_WGMMA` not `0`.
pub(super) fn applies(k: &MatMulKernel, storage: &BufferStorage) -> bool {
    let Some(inputs @ Inputs::Half(_)) = inputs_of(k, storage) else { return false };
    let on = std::env::var("GT_WGMMA").map_or(true, |v| v != "0");
    on && Plan::lhs(k, inputs) == Plan::Async && Plan::rhs(k, inputs) == Plan::Async
}

/// The 64-bit shared-memory matrix descriptor of a 128-byte-swizzled operand, less its
/// address: leading byte offset (A: unused, 1; B: between 64-column blocks), stride byte
/// offset (8 rows: 1024), layout `SWIZZLE_128B` (bits 62-63 = 1). Offsets in 16-byte units.
fn descriptor_bits(leading: usize) -> u64 {
    ((leading as u64 >> 4) << 16) | ((ATOM as u64 >> 4) << 32) | (1u64 << 62)
}

pub(super) fn matmul(k: &MatMulKernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    check_sizes(k)?;
    let Some(Inputs::Half(half)) = inputs_of(k, storage) else { unreachable!("wgmma::applies was checked") };
    let t = WgTile::from_env(k.m, k.n);
    let mut e = Emitter::new(storage);
    e.target("8.0", "sm_90a");
    let block = block_setup(&mut e, k, t.bm, t.bn);
    let nb = k.batch.len();
    let raw = e.value(Reg::B32, "mov.u32", "gt_smem");
    let up = e.value(Reg::B32, "add.u32", &format!("{raw}, {}", ATOM - 1));
    let smem = e.value(Reg::B32, "and.b32", &format!("{up}, {}", !(ATOM as u32 - 1)));
    let a_loads = a_loads(&mut e, k, t, &block);
    let b_loads = b_loads(&mut e, k, t, &block);
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
        e.op(format!("add.s32 {k0}, {k0}, {BK}"));
    }
    let write = e.value(Reg::B32, "mov.u32", &((stages - 2) * stage_bytes).to_string());
    let read = e.value(Reg::B32, "mov.u32", "0");
    let stage = e.value(Reg::B32, "mov.s32", "0");
    let ty = if half == Storage::F16 { "f16" } else { "bf16" };
    let (a_bits, b_bits) = (descriptor_bits(16), descriptor_bits(BK * ROW));
    e.counted_loop(("stage", "stages_done"), &stage, k.k.div_ceil(BK), "1", |e| {
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
        e.op(format!("add.s32 {k0}, {k0}, {BK}"));
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
        for kk in 0..BK / 16 {
            // 16 deeper: 32 bytes along A's swizzled rows, 16 rows (2 atoms) down B.
            let b = e.value(Reg::B64, "add.s64", &format!("{b_desc}, {}", kk * 16 * ROW / 16));
            for part in 0..t.parts() {
                let a = e.value(Reg::B64, "add.s64", &format!("{a_desc}, {}", (part * 64 * ROW + kk * 32) / 16));
                let d = acc[part * per_part..(part + 1) * per_part].join(", ");
                e.op(format!(
                    "wgmma.mma_async.sync.aligned.m64n{}k16.f32.{ty}.{ty} {{{d}}}, {a}, {b}, {scale_d}, 1, 1, 0, 1",
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
        "matmul {}x{}x{} (batch {}), {ty} warpgroup tensor cores (wgmma m64n{}k16, 128-byte swizzle), \
         tile {}x{}x{BK}, {} warpgroup(s), {stages} stages, epilogue of {} nodes",
        k.m,
        k.n,
        k.k,
        k.batch_count(),
        t.bn,
        t.bm,
        t.bn,
        t.warpgroups(),
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

/// This thread's `cp.async` chunks of A's stage: thread `tid` copies chunk `tid % 8` of rows
/// `tid / 8 + j threads / 8`; as that step is a multiple of 8 rows, the swizzled place
/// differs between them by whole rows only.
fn a_loads(e: &mut Emitter, k: &MatMulKernel, t: WgTile, block: &Block) -> Loads {
    let nb = k.batch.len();
    let Block { tid, row0, a_base, .. } = block;
    let threads = t.threads();
    let row = e.value(Reg::B32, "shr.u32", &format!("{tid}, 3"));
    let chunk = e.value(Reg::B32, "and.b32", &format!("{tid}, 7"));
    let fixed = e.value(Reg::B32, "add.s32", &format!("{row0}, {row}"));
    let fixed_stride = k.lhs.strides[nb];
    let fixed_off = e.value(Reg::B32, "mad.lo.s32", &format!("{fixed}, {fixed_stride}, {a_base}"));
    let kk = e.value(Reg::B32, "shl.b32", &format!("{chunk}, 3"));
    let tile = swizzled(e, &row, &chunk);
    let rows_per_load = threads / 8;
    let offsets = (0..t.bm / rows_per_load).map(|j| (j * rows_per_load, 0, j * rows_per_load * ROW)).collect();
    Loads { operand: Operand::A, chunk: true, fixed, fixed_off, kk, tile, fixed_stride, bound: k.m, offsets }
}

/// This thread's chunks of B's stage: chunk `tid % (bn / 8)` of k rows `tid / (bn / 8) + j
/// threads / (bn / 8)` (a multiple of 8 rows apart, as `threads >= bn`), in column block
/// `chunk / 8` (each `BK` rows of 128 bytes).
fn b_loads(e: &mut Emitter, k: &MatMulKernel, t: WgTile, block: &Block) -> Loads {
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
        // Ampere code, and f32 operands, take mma.sync; a transposed B does too.
        let ampere = generate_for(&kernel, &halves(&mm, Storage::Bf16), Target::Sm80).unwrap();
        assert!(ampere.text.contains("mma.sync") && !ampere.text.contains("wgmma"));
        let f32s = generate_for(&kernel, &BufferStorage::f32(3), Target::Sm90a).unwrap();
        assert!(!f32s.text.contains("wgmma"));
        let mut t = mm.clone();
        t.rhs = Access { offset: 0, strides: vec![1, 4096] };
        let tk = Kernel::MatMul(t.clone());
        assert!(!generate_for(&tk, &halves(&t, Storage::F16), Target::Sm90a).unwrap().text.contains("wgmma"));
        // A smaller product gets 128-wide blocks.
        let Kernel::MatMul(small) = samples::linear_relu(512, 512, 512) else { unreachable!() };
        let text =
            generate_for(&Kernel::MatMul(small.clone()), &halves(&small, Storage::F16), Target::Sm90a).unwrap().text;
        assert!(text.contains(".f32.f16.f16") && text.contains("m64n128k16"), "{}", text.lines().next().unwrap());
    }

    #[test]
    fn tiles_are_checked() {
        assert!(WgTile { bm: 128, bn: 256, stages: 4 }.valid());
        assert!(WgTile { bm: 256, bn: 128, stages: 4 }.valid());
        assert!(WgTile { bm: 64, bn: 128, stages: 6 }.valid());
        // Too many accumulators, B rows that would not keep their swizzle, too much memory.
        assert!(!WgTile { bm: 256, bn: 256, stages: 3 }.valid());
        assert!(!WgTile { bm: 64, bn: 256, stages: 4 }.valid());
        assert!(!WgTile { bm: 128, bn: 256, stages: 5 }.valid());
        assert!(!WgTile { bm: 96, bn: 128, stages: 4 }.valid());
    }

    #[test]
    fn descriptors_hold_offsets_in_16_byte_units_and_the_swizzle() {
        assert_eq!(descriptor_bits(16), (1 << 16) | (64 << 32) | (1 << 62));
        assert_eq!(descriptor_bits(8192), (512 << 16) | (64 << 32) | (1 << 62));
    }
}
