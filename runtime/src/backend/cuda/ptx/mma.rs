//! The tensor-core matmuls: two half-precision operands (`f16` or `bf16`, `mma.sync
//! m16n8k16`), or `f32` operands rounded to TF32 (`m16n8k8`, `GT_MATMUL_PRECISION=high`), summed
//! in `f32`: a 128x128 tile per block of 4 warps (64x64 each; [`Tile`]), A's fragments read by
//! `ldmatrix` (B's too for halves, transposed; TF32's B by 32-bit shared loads) from shared
//! tiles that a multi-stage `cp.async` pipeline fills while earlier stages are multiplied.
//! An operand whose rows are contiguous and 16-byte aligned is copied by `cp.async` in
//! 16-byte chunks (zero-filled past the edges); any other (transposed, odd sizes) is loaded
//! element by element into the same tiles, so every shape is correct and the common one is
//! fast. The epilogue and the rounding store are the FMA matmul's.

use super::emit::{f32_imm, Emitter, Reg};
use super::matmul::{block_setup, check_sizes, grid, store, Block, Product};
use super::{PtxError, PtxKernel};
use gt_ir::kernel::{BufferStorage, MatMulKernel, Precision, Storage};

/// Depth of one stage (two `k16` steps, or four `k8`).
const BK: usize = 32;

/// What the tensor cores multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Inputs {
    /// Two operands of this half type (`m16n8k16`).
    Half(Storage),
    /// `f32` operands rounded to TF32 (`m16n8k8`).
    Tf32,
}

impl Inputs {
    /// Bytes per element.
    pub(super) fn elem(self) -> usize {
        if self == Inputs::Tf32 {
            4
        } else {
            2
        }
    }

    /// Elements per 16-byte chunk (one `cp.async`, one `ldmatrix` row).
    pub(super) fn chunk(self) -> usize {
        16 / self.elem()
    }

    /// Shared row length of A (`[m][k]`): padded by 16 bytes so that the 8 rows one
    /// `ldmatrix` reads fall in distinct banks.
    fn a_ld(self) -> usize {
        BK + self.chunk()
    }

    /// The contracted depth of one `mma`.
    fn k_step(self) -> usize {
        if self == Inputs::Tf32 {
            8
        } else {
            16
        }
    }
}

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

impl Tile {
    /// 128x128 blocks of 4 warps of 64x64: the fastest of the tilings measured on an H100 at
    /// 4096^3 in bf16 (4 stages: 273 TFLOP/s; 8 warps of 64x32: 264; 128x256 and 256x128
    /// blocks of 64x64 warps, 3 stages: 261, 252; `bench/results/cuda-h100.txt`). TF32 tiles
    /// take twice the bytes: 3 stages, so that two blocks fit an SM's shared memory.
    fn default_for(inputs: Inputs) -> Tile {
        let stages = if inputs == Inputs::Tf32 { 3 } else { 4 };
        Tile { bm: 128, bn: 128, wm: 64, wn: 64, stages }
    }

    /// `GT_MMA_TILE=BMxBNxWMxWNxSTAGES` (a tuning knob for benchmarks), else the default.
    fn from_env(inputs: Inputs) -> Tile {
        let parse = |v: &str| -> Option<Tile> {
            let n: Vec<usize> = v.split('x').map(|p| p.parse().ok()).collect::<Option<_>>()?;
            let [bm, bn, wm, wn, stages] = n[..] else { return None };
            let t = Tile { bm, bn, wm, wn, stages };
            t.valid(inputs).then_some(t)
        };
        std::env::var("GT_MMA_TILE").ok().and_then(|v| parse(&v)).unwrap_or(Tile::default_for(inputs))
    }

    /// Whether the loads divide evenly among the threads and the warps tile the block.
    fn valid(self, inputs: Inputs) -> bool {
        let warps_ok = self.wm.is_multiple_of(16)
            && self.wn.is_multiple_of(16)
            && self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn);
        warps_ok && (2..=8).contains(&self.stages) && {
            let t = self.threads();
            (64..=512).contains(&t)
                && (self.bm * BK / inputs.chunk()).is_multiple_of(t)
                && (self.bn * BK / inputs.chunk()).is_multiple_of(t)
                && self.shared_bytes(inputs) <= 200 << 10
        }
    }

    fn threads(self) -> usize {
        (self.bm / self.wm) * (self.bn / self.wn) * 32
    }

    /// Shared row length of B (`[k][n]`), padded by 16 bytes like A's.
    fn b_ld(self, inputs: Inputs) -> usize {
        self.bn + inputs.chunk()
    }

    fn a_bytes(self, inputs: Inputs) -> usize {
        self.bm * inputs.a_ld() * inputs.elem()
    }

    fn stage_bytes(self, inputs: Inputs) -> usize {
        self.a_bytes(inputs) + BK * self.b_ld(inputs) * inputs.elem()
    }

    /// Dynamic shared memory of the pipelined kernel, in bytes.
    fn shared_bytes(self, inputs: Inputs) -> usize {
        self.stages * self.stage_bytes(inputs)
    }
}

/// What this kernel multiplies on tensor cores, if it does: two operands of the same half
/// type, or `f32` operands when TF32 was asked for.
pub(super) fn inputs_of(k: &MatMulKernel, storage: &BufferStorage) -> Option<Inputs> {
    let (a, b) = (storage.inputs[0], storage.inputs[1]);
    match (a, b) {
        _ if a != b => None,
        (Storage::F32, _) => (k.precision == Precision::Tf32).then_some(Inputs::Tf32),
        (half, _) => Some(Inputs::Half(half)),
    }
}

/// Whether this kernel runs here (on tensor cores).
pub(super) fn applies(k: &MatMulKernel, storage: &BufferStorage) -> bool {
    inputs_of(k, storage).is_some()
}

pub(super) fn matmul(k: &MatMulKernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    check_sizes(k)?;
    let inputs = inputs_of(k, storage).expect("mma::applies was checked");
    let t = Tile::from_env(inputs);
    let mut e = Emitter::new(storage);
    let block = block_setup(&mut e, k, t.bm, t.bn);
    let nb = k.batch.len();
    let (a_plan, b_plan) = (Plan::lhs(k, inputs), Plan::rhs(k, inputs));
    let smem = e.value(Reg::B32, "mov.u32", "gt_smem");
    let a_loads = operand_loads(&mut e, k, (t, inputs), &block, Operand::A, a_plan);
    let b_loads = operand_loads(&mut e, k, (t, inputs), &block, Operand::B, b_plan);
    let (products, frag) = fragments(&mut e, (t, inputs), &block.tid);
    let acc: Vec<String> = products.iter().map(|p| p.acc.clone()).collect();
    for a in &acc {
        e.op(format!("mov.f32 {a}, {}", f32_imm(0.0)));
    }
    let k_steps = [k.lhs.strides[nb + 1], k.rhs.strides[nb]];
    let (stages, stage_bytes, shared) = (t.stages, t.stage_bytes(inputs), t.shared_bytes(inputs));
    let (elem, a_ld, b_ld, a_bytes) = (inputs.elem(), inputs.a_ld(), t.b_ld(inputs), t.a_bytes(inputs));

    // Prologue: the first stages - 1 stages in flight.
    let k0 = e.value(Reg::B32, "mov.s32", "0");
    let slot = e.reg(Reg::B32);
    for s in 0..stages - 1 {
        e.op(format!("add.u32 {slot}, {smem}, {}", s * stage_bytes));
        load_stage(&mut e, k, (&block, elem), &a_loads, &slot, &k0, k_steps[0]);
        load_stage(&mut e, k, (&block, elem), &b_loads, &slot, &k0, k_steps[1]);
        e.op("cp.async.commit_group");
        e.op(format!("add.s32 {k0}, {k0}, {BK}"));
    }
    // Byte offsets of the stage being written and of the one being read.
    let write = e.value(Reg::B32, "mov.u32", &((stages - 1) * stage_bytes).to_string());
    let read = e.value(Reg::B32, "mov.u32", "0");
    let stage = e.value(Reg::B32, "mov.s32", "0");
    let (ty, shape) = match inputs {
        Inputs::Half(Storage::F16) => ("f16", "m16n8k16"),
        Inputs::Half(_) => ("bf16", "m16n8k16"),
        Inputs::Tf32 => ("tf32", "m16n8k8"),
    };
    let (m_tiles, n_tiles) = (t.wm / 16, t.wn / 8);
    e.counted_loop(("stage", "stages_done"), &stage, k.k.div_ceil(BK), "1", |e| {
        // This stage's copies are done (at most stages - 2 newer groups pending), and every
        // warp is past the products of the stage about to be overwritten.
        e.op(format!("cp.async.wait_group {}", stages - 2));
        e.op("bar.sync 0");
        e.op(format!("add.u32 {slot}, {smem}, {write}"));
        load_stage(e, k, (&block, elem), &a_loads, &slot, &k0, k_steps[0]);
        load_stage(e, k, (&block, elem), &b_loads, &slot, &k0, k_steps[1]);
        e.op("cp.async.commit_group");
        e.op(format!("add.s32 {k0}, {k0}, {BK}"));
        let base = e.value(Reg::B32, "add.u32", &format!("{smem}, {read}"));
        let a_at = e.value(Reg::B32, "add.u32", &format!("{base}, {}", frag.a_lane));
        let b_at = e.value(Reg::B32, "add.u32", &format!("{base}, {}", frag.b_lane));
        let ks = inputs.k_step();
        // TF32 operands are f32 rounded to 10-bit mantissas (as PyTorch's allow_tf32).
        let tf32 = |e: &mut Emitter, regs: &[String]| {
            if inputs == Inputs::Tf32 {
                for r in regs {
                    e.op(format!("cvt.rna.tf32.f32 {r}, {r}"));
                }
            }
        };
        for step in 0..BK / ks {
            // A: 16 x ks fragments (rows 16 mi of the warp's), one ldmatrix.x4 each (for
            // TF32 an 8x8 matrix of halves is 8 rows of 4 f32).
            let a: Vec<Vec<String>> = (0..m_tiles)
                .map(|mi| {
                    let regs: Vec<String> = (0..4).map(|_| e.reg(Reg::B32)).collect();
                    let at = mi * 16 * a_ld * elem + step * ks * elem;
                    e.op(format!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}}}, [{a_at}+{at}]", regs.join(", ")));
                    tf32(e, &regs);
                    regs
                })
                .collect();
            let mut b: Vec<Vec<String>> = Vec::new();
            if inputs == Inputs::Tf32 {
                // B: b0 = (k q, n g) and b1 = (k q + 4, n g) of each 8-column tile, one
                // 32-bit shared load each (b_lane is this lane's (q, g)).
                for ni in 0..n_tiles {
                    let at = a_bytes + step * ks * b_ld * elem + ni * 8 * elem;
                    let regs: Vec<String> = [at, at + 4 * b_ld * elem]
                        .iter()
                        .map(|o| e.value(Reg::B32, "ld.shared.b32", &format!("[{b_at}+{o}]")))
                        .collect();
                    tf32(e, &regs);
                    b.push(regs);
                }
            } else {
                // B: one ldmatrix.x4.trans per two 8-column tiles, their (b0, b1).
                for nj in 0..n_tiles / 2 {
                    let regs: Vec<String> = (0..4).map(|_| e.reg(Reg::B32)).collect();
                    let at = a_bytes + step * ks * b_ld * elem + nj * 16 * elem;
                    e.op(format!(
                        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{}}}, [{b_at}+{at}]",
                        regs.join(", ")
                    ));
                    b.push(vec![regs[0].clone(), regs[1].clone()]);
                    b.push(vec![regs[2].clone(), regs[3].clone()]);
                }
            }
            for (mi, a) in a.iter().enumerate() {
                for (ni, b) in b.iter().enumerate() {
                    let first = (mi * n_tiles + ni) * 4;
                    let d = acc[first..first + 4].join(", ");
                    e.op(format!(
                        "mma.sync.aligned.{shape}.row.col.f32.{ty}.{ty}.f32 {{{d}}}, {{{}}}, {{{}}}, {{{d}}}",
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
        "matmul {}x{}x{} (batch {}), {ty} tensor cores (mma.sync {shape}, ldmatrix), tile {}x{}x{BK}, \
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
    // Two blocks per SM where the accumulators leave room: ptxas then keeps registers to
    // what that allows (sm_90, no spills: 202 registers for bf16 and 255 for TF32 with the
    // default tile; 64x64 warp tiles in 8 warps would spill at 128, so they get one block).
    let threads = t.threads();
    let blocks = if threads * (t.wm * t.wn / 32 + 60) * 2 <= 65_536 { 2 } else { 1 };
    e.launch_bounds(threads, blocks);
    let text = e.finish(&comment, globals, 3 + k.epilogue_inputs.len());
    Ok(PtxKernel { text, grid: grid(k, t.bm, t.bn)?, block: (threads as u32, 1, 1), shared: shared as u32 })
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Operand {
    A,
    B,
}

/// How an operand's tile is loaded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// 16-byte `cp.async` chunks along the tile's contiguous rows.
    Async,
    /// One element per load, threads along the operand's unit-stride axis (`true`: along
    /// the tile's fast axis: k for A, n for B).
    Elements { along_fast: bool },
}

impl Plan {
    /// A's tile rows run along k.
    pub(super) fn lhs(k: &MatMulKernel, inputs: Inputs) -> Plan {
        Plan::of(&k.lhs, k.batch.len(), k.k, inputs)
    }

    /// B's tile rows run along n.
    pub(super) fn rhs(k: &MatMulKernel, inputs: Inputs) -> Plan {
        Plan::of(&k.rhs, k.batch.len(), k.n, inputs)
    }

    /// An operand read through `a` (`nb` batch axes, then the tile's other axis, then its
    /// fast one, `fast_len` long): chunks when the fast axis is contiguous and every row
    /// starts 16-byte aligned.
    fn of(a: &gt_ir::kernel::Access, nb: usize, fast_len: usize, inputs: Inputs) -> Plan {
        let c = inputs.chunk() as i64;
        let (s_other, s_fast) = (a.strides[nb], a.strides[nb + 1]);
        let aligned = a.offset % c == 0 && a.strides[..nb].iter().all(|s| s % c == 0);
        if s_fast == 1 && s_other % c == 0 && fast_len.is_multiple_of(inputs.chunk()) && aligned {
            Plan::Async
        } else {
            Plan::Elements { along_fast: s_fast == 1 || s_other != 1 }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Plan::Async => "cp.async",
            Plan::Elements { .. } => "element loads",
        }
    }
}

/// This thread's loads of each stage of one operand: the same few base registers for all of
/// them (so the loads cost no registers each), and per load constant offsets from them.
/// A load reads the tile element (or 16-byte chunk starting at) fixed coordinate
/// `origin + fixed0 + fixed` (a row of A, a column of B) and contracted index `k0 + kk0 + kk`.
pub(super) struct Loads {
    pub(super) operand: Operand,
    /// 16-byte chunks by `cp.async`, or single elements.
    pub(super) chunk: bool,
    /// `origin + fixed0`, its global offset (`* stride + batch base`), and `kk0`.
    pub(super) fixed: String,
    pub(super) fixed_off: String,
    pub(super) kk: String,
    /// The byte offset in a stage's tiles of (fixed0, kk0).
    pub(super) tile: String,
    /// The fixed coordinate's stride in the operand, and its bound.
    pub(super) fixed_stride: i64,
    pub(super) bound: usize,
    /// Per load: (fixed, kk) offsets from the bases, and the tile byte offset they make.
    pub(super) offsets: Vec<(usize, usize, usize)>,
}

/// The loads this thread makes of each stage of operand `which`.
fn operand_loads(
    e: &mut Emitter,
    k: &MatMulKernel,
    (t, inputs): (Tile, Inputs),
    block: &Block,
    which: Operand,
    plan: Plan,
) -> Loads {
    let nb = k.batch.len();
    let Block { tid, row0, col0, a_base, b_base, .. } = block;
    let threads = t.threads();
    let (fixed_len, fixed_stride, bound, origin, base, tile_start) = match which {
        Operand::A => (t.bm, k.lhs.strides[nb], k.m, row0, a_base, 0),
        Operand::B => (t.bn, k.rhs.strides[nb + 1], k.n, col0, b_base, t.a_bytes(inputs)),
    };
    let (elem, chunk) = (inputs.elem(), inputs.chunk());
    // Bytes per step of the fixed coordinate and of k in the tile: A is [m][k] rows of
    // a_ld, B is [k][n] rows of b_ld.
    let (fixed_bytes, kk_bytes) = match which {
        Operand::A => (inputs.a_ld() * elem, elem),
        Operand::B => (elem, t.b_ld(inputs) * elem),
    };
    // Load j of thread tid is item tid + threads j of the tile, `per_row` items to a row
    // (`width` elements each): (inner, outer) base registers and per-load offsets.
    let split = |e: &mut Emitter, per_row: usize, count: usize| -> ((String, String), Vec<(usize, usize)>) {
        if threads.is_multiple_of(per_row) {
            let inner = e.value(Reg::B32, "rem.u32", &format!("{tid}, {per_row}"));
            let outer = e.value(Reg::B32, "div.u32", &format!("{tid}, {per_row}"));
            ((inner, outer), (0..count).map(|j| (0, j * threads / per_row)).collect())
        } else {
            // Rows longer than the block: each load's row is a constant.
            let outer = e.value(Reg::B32, "mov.u32", "0");
            ((tid.clone(), outer), (0..count).map(|j| ((threads * j) % per_row, threads * j / per_row)).collect())
        }
    };
    // (fixed, kk) bases and offsets, in elements.
    let (is_chunk, (fixed0, kk0), offsets) = match plan {
        Plan::Async => {
            // A rows run along k (BK / chunk chunks each), B rows along n (bn / chunk).
            let per_row = if which == Operand::A { BK / chunk } else { t.bn / chunk };
            let ((inner, outer), offs) = split(e, per_row, fixed_len * BK / chunk / threads);
            let first = e.value(Reg::B32, "mul.lo.u32", &format!("{inner}, {chunk}"));
            let offs = offs.into_iter().map(|(i, o)| (i * chunk, o));
            match which {
                Operand::A => (true, (outer, first), offs.map(|(i, o)| (o, i)).collect::<Vec<_>>()),
                Operand::B => (true, (first, outer), offs.collect()),
            }
        }
        Plan::Elements { along_fast } => {
            // Consecutive threads along the unit-stride axis, so the loads coalesce.
            let lanes_along_k = if which == Operand::A { along_fast } else { !along_fast };
            let per_row = if lanes_along_k { BK } else { fixed_len };
            let ((inner, outer), offs) = split(e, per_row, fixed_len * BK / threads);
            if lanes_along_k {
                (false, (outer, inner), offs.into_iter().map(|(i, o)| (o, i)).collect())
            } else {
                (false, (inner, outer), offs)
            }
        }
    };
    let fixed = e.value(Reg::B32, "add.s32", &format!("{origin}, {fixed0}"));
    let fixed_off = e.value(Reg::B32, "mad.lo.s32", &format!("{fixed}, {fixed_stride}, {base}"));
    let tile = e.value(Reg::B32, "mul.lo.u32", &format!("{fixed0}, {fixed_bytes}"));
    let tile = e.value(Reg::B32, "mad.lo.u32", &format!("{kk0}, {kk_bytes}, {tile}"));
    let tile = e.value(Reg::B32, "add.u32", &format!("{tile}, {tile_start}"));
    let offsets = offsets.into_iter().map(|(f, kk)| (f, kk, f * fixed_bytes + kk * kk_bytes)).collect();
    Loads { operand: which, chunk: is_chunk, fixed, fixed_off, kk: kk0, tile, fixed_stride, bound, offsets }
}

/// Issues this thread's loads of the stage starting at `k0` into the stage at shared
/// address `slot`: past k or the fixed bound, chunks are zero-filled and elements are 0.
pub(super) fn load_stage(
    e: &mut Emitter,
    k: &MatMulKernel,
    (block, elem): (&Block, usize),
    loads: &Loads,
    slot: &str,
    k0: &str,
    k_stride: i64,
) {
    let base = if loads.operand == Operand::A { &block.a_ptr } else { &block.b_ptr };
    let kk = e.value(Reg::B32, "add.s32", &format!("{k0}, {}", loads.kk));
    let dst = e.value(Reg::B32, "add.u32", &format!("{slot}, {}", loads.tile));
    for &(f, dk, byte) in &loads.offsets {
        let kidx = if dk == 0 { kk.clone() } else { e.value(Reg::B32, "add.s32", &format!("{kk}, {dk}")) };
        let k_ok = e.predicate("lt.s32", &kidx, &k.k.to_string());
        // origin + fixed0 + f < bound
        let f_ok = e.predicate("lt.s32", &loads.fixed, &(loads.bound as i64 - f as i64).to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{k_ok}, {f_ok}"));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{kidx}, {k_stride}, {}", loads.fixed_off));
        let off = match f as i64 * loads.fixed_stride {
            0 => off,
            d => e.value(Reg::B32, "add.s32", &format!("{off}, {d}")),
        };
        // Out of range, read the buffer's first element instead (never outside it).
        let off = e.value(Reg::B32, "selp.b32", &format!("{off}, 0, {ok}"));
        let addr = e.element_address(base, &off);
        if loads.chunk {
            let size = e.value(Reg::B32, "selp.u32", &format!("16, 0, {ok}"));
            e.op(format!("cp.async.cg.shared.global [{dst}+{byte}], [{addr}], 16, {size}"));
        } else {
            // The element's bits, as stored.
            let (reg, bits) = if elem == 4 { (Reg::B32, "b32") } else { (Reg::B16, "b16") };
            let h = e.reg(reg);
            e.op(format!("mov.{bits} {h}, 0"));
            e.op(format!("@{ok} ld.global.nc.{bits} {h}, [{addr}]"));
            e.op(format!("st.shared.{bits} [{dst}+{byte}], {h}"));
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
fn fragments(e: &mut Emitter, (t, inputs): (Tile, Inputs), tid: &str) -> (Vec<Product>, Fragments) {
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
    // A: (wm + row, 16 bytes x half) in [m][a_ld].
    let a_row = e.value(Reg::B32, "add.u32", &format!("{wm}, {row}"));
    let a_lane = e.value(Reg::B32, "mul.lo.u32", &format!("{a_row}, {}", inputs.a_ld() * inputs.elem()));
    let a_lane = e.value(Reg::B32, "mad.lo.u32", &format!("{half}, 16, {a_lane}"));
    let g = e.value(Reg::B32, "shr.u32", &format!("{lane}, 2"));
    let q = e.value(Reg::B32, "and.b32", &format!("{lane}, 3"));
    let (b_ld, elem) = (t.b_ld(inputs), inputs.elem());
    let b_lane = if inputs == Inputs::Tf32 {
        // TF32's B by 32-bit loads: this lane's (k q, n wn + g) in [k][b_ld] (PTX ISA,
        // m16n8k8 .tf32: b0 = (q, g), b1 = (q + 4, g); A as for halves, in 32-bit columns).
        let r = e.value(Reg::B32, "mul.lo.u32", &format!("{q}, {}", b_ld * elem));
        let col = e.value(Reg::B32, "add.u32", &format!("{wn}, {g}"));
        e.value(Reg::B32, "mad.lo.u32", &format!("{col}, {elem}, {r}"))
    } else {
        // B by ldmatrix.trans: (k row, wn + 8 half) in [k][b_ld].
        let r = e.value(Reg::B32, "mul.lo.u32", &format!("{row}, {}", b_ld * elem));
        let col = e.value(Reg::B32, "mad.lo.u32", &format!("{half}, 8, {wn}"));
        e.value(Reg::B32, "mad.lo.u32", &format!("{col}, {elem}, {r}"))
    };
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
        let inputs = inputs_of(k, &storage).unwrap();
        assert_eq!((p.block, p.shared as usize), ((128, 1, 1), Tile::default_for(inputs).shared_bytes(inputs)));
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

    #[test]
    fn tf32_runs_here_only_when_asked_for() {
        let Kernel::MatMul(mut mm) = samples::linear_relu(4096, 4096, 4096) else { unreachable!() };
        let f32s = BufferStorage::f32(3);
        assert!(!applies(&mm, &f32s));
        mm.precision = Precision::Tf32;
        assert!(applies(&mm, &f32s));
        let text = ptx(&mm, Storage::F32);
        assert!(text.contains("tf32 tensor cores (mma.sync m16n8k8, ldmatrix)") && text.contains("3 stages"));
        assert!(text.contains("A by cp.async, B by cp.async") && text.contains("cvt.rna.tf32.f32"));
        // 4-element chunks: k = 4092 still copies by cp.async, 4090 does not.
        mm.k = 4092;
        assert!(ptx(&mm, Storage::F32).contains("A by cp.async"));
        mm.k = 4090;
        mm.lhs = Access { offset: 0, strides: vec![4090, 1] };
        assert!(ptx(&mm, Storage::F32).contains("A by element loads"));
    }
}
