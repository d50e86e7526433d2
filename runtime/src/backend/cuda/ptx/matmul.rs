//! The tiled FMA matmul: a `BM x BN` tile per block, staged through shared memory `BK` deep
//! with the next stage's global loads in registers, its products by FMA (`TM x TN` per
//! thread), then the epilogue applied to each product element as it is stored (that part,
//! [`store`], is shared with the tensor-core matmuls of `mma.rs`). Operands of mixed storage
//! come here whatever the precision asked: `mma.rs` takes two halves or two TF32 operands.

use super::emit::{f32_imm, Emitter, Reg};
use super::math::Leaf;
use super::{check, PtxError, PtxKernel, MAX_GRID_YZ};
use gt_ir::kernel::{BufferStorage, MatMulKernel};

/// A matmul tiling: block tile `bm x bn`, `tm x tn` outputs per thread, `bk` deep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiling {
    /// Block tile rows.
    pub bm: usize,
    /// Block tile columns.
    pub bn: usize,
    /// Rows per thread.
    pub tm: usize,
    /// Columns per thread.
    pub tn: usize,
    /// Depth of one shared-memory stage.
    pub bk: usize,
}

impl Tiling {
    /// The tiling used for an `m x n` result: big tiles for big matrices, small ones so that
    /// small products still spread over many blocks.
    pub fn for_shape(m: usize, n: usize) -> Tiling {
        let fma = |bm, tm, bk| Tiling { bm, bn: bm, tm, tn: tm, bk };
        if m * n >= 1 << 20 {
            fma(128, 8, 8)
        } else if m * n >= 1 << 17 {
            fma(64, 4, 16)
        } else {
            fma(32, 2, 16)
        }
    }

    fn threads(self) -> usize {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
}

pub(super) fn matmul(k: &MatMulKernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    check_sizes(k)?;
    let t = Tiling::for_shape(k.m, k.n);
    let threads = t.threads();
    let (lda, ldb) = (t.bm, t.bn);

    let mut e = Emitter::new(storage);
    let block = block_setup(&mut e, k, t.bm, t.bn);
    let tiles = tile_loads(&mut e, k, t, &block);
    // What this thread accumulates, and the code of one stage's products.
    let (products, compute) = fma_products(&mut e, t, &block.tid, &tiles);
    main_loop(&mut e, k, t, &block, &tiles, &*compute);
    store(&mut e, k, &block, &products);
    let globals = format!(
        ".shared .align 16 .b8 gt_tile_a[{}];\n.shared .align 16 .b8 gt_tile_b[{}];\n\n",
        t.bk * lda * 4,
        t.bk * ldb * 4
    );
    let comment = format!(
        "matmul {}x{}x{} (batch {}), f32 FMA, tile {}x{}x{}, {}x{} per thread, epilogue of {} nodes",
        k.m,
        k.n,
        k.k,
        k.batch_count(),
        t.bm,
        t.bn,
        t.bk,
        t.tm,
        t.tn,
        k.epilogue.len()
    );
    let grid = grid(k, t.bm, t.bn)?;
    Ok(PtxKernel {
        text: e.finish(&comment, &globals, 3 + k.epilogue_inputs.len()),
        grid,
        block: (threads as u32, 1, 1),
        shared: 0,
    })
}

/// Refuses operands or results too large for 32-bit indexing.
pub(super) fn check_sizes(k: &MatMulKernel) -> Result<(), PtxError> {
    let mut lhs_dims = k.batch.clone();
    lhs_dims.extend([k.m, k.k]);
    let mut rhs_dims = k.batch.clone();
    rhs_dims.extend([k.k, k.n]);
    check(k.lhs.span(&lhs_dims))?;
    check(k.rhs.span(&rhs_dims))?;
    check(k.batch_count().saturating_mul(k.m).saturating_mul(k.n))?;
    let mut out_dims = k.batch.clone();
    out_dims.extend([k.m, k.n]);
    for a in &k.epilogue_inputs {
        check(a.span(&out_dims))?;
    }
    Ok(())
}

/// The grid of `bm x bn` block tiles over the result, one z-slice per matrix of the batch.
pub(super) fn grid(k: &MatMulKernel, bm: usize, bn: usize) -> Result<(u32, u32, u32), PtxError> {
    let grid = (k.n.div_ceil(bn) as u32, k.m.div_ceil(bm) as u32, k.batch_count() as u32);
    if grid.1 > MAX_GRID_YZ || grid.2 > MAX_GRID_YZ {
        return Err(PtxError::Grid { row_tiles: grid.1, matrices: grid.2 });
    }
    Ok(grid)
}

/// What a block computes before its tiles: buffer addresses, its tile's origin and the
/// batch offsets of its matrices.
pub(super) struct Block {
    pub(super) out: String,
    pub(super) a_ptr: String,
    pub(super) b_ptr: String,
    pub(super) epi_ptrs: Vec<String>,
    pub(super) tid: String,
    pub(super) row0: String,
    pub(super) col0: String,
    pub(super) a_base: String,
    pub(super) b_base: String,
    pub(super) out_base: String,
    /// Per epilogue input: its batch offset and its (row, column) strides.
    pub(super) epi_bases: Vec<(String, [i64; 2])>,
}

/// One global load of a stage: the element offset at k0 = 0 (advanced each stage), its
/// row/col bound check, its contracted index and its shared-memory slot.
struct Load {
    offset: String,
    in_range: String,
    k: String,
    slot: String,
}

/// This thread's loads of each stage (A's, then B's) and the shared tiles' addresses.
struct Tiles {
    a_loads: Vec<Load>,
    b_loads: Vec<Load>,
    a_sh: String,
    b_sh: String,
}

/// The code of one stage's products, emitted once per stage of the main loop.
type Stage = Box<dyn Fn(&mut Emitter)>;

pub(super) fn block_setup(e: &mut Emitter, k: &MatMulKernel, bm: usize, bn: usize) -> Block {
    let nb = k.batch.len();
    let out = e.param_pointer("gt_param_0");
    let a_ptr = e.param_pointer("gt_param_1");
    let b_ptr = e.param_pointer("gt_param_2");
    let epi_ptrs: Vec<String> =
        (0..k.epilogue_inputs.len()).map(|i| e.param_pointer(&format!("gt_param_{}", i + 3))).collect();
    let tid = e.special("%tid.x");
    let (bx, by, bz) = (e.special("%ctaid.x"), e.special("%ctaid.y"), e.special("%ctaid.z"));
    let row0 = e.value(Reg::B32, "mul.lo.s32", &format!("{by}, {bm}"));
    let col0 = e.value(Reg::B32, "mul.lo.s32", &format!("{bx}, {bn}"));
    let batch_coords = e.coords(&bz, &k.batch);
    let a_base = e.dot(k.lhs.offset, &batch_coords, &k.lhs.strides[..nb]);
    let b_base = e.dot(k.rhs.offset, &batch_coords, &k.rhs.strides[..nb]);
    let out_base = e.value(Reg::B32, "mul.lo.s32", &format!("{bz}, {}", k.m * k.n));
    let epi_bases: Vec<(String, [i64; 2])> = k
        .epilogue_inputs
        .iter()
        .map(|a| (e.dot(a.offset, &batch_coords, &a.strides[..nb]), [a.strides[nb], a.strides[nb + 1]]))
        .collect();
    Block { out, a_ptr, b_ptr, epi_ptrs, tid, row0, col0, a_base, b_base, out_base, epi_bases }
}

/// Which tile elements this thread loads each stage: A (row am, column ak) and B (row bk,
/// column bn).
fn tile_loads(e: &mut Emitter, k: &MatMulKernel, t: Tiling, block: &Block) -> Tiles {
    let Block { tid, row0, col0, a_base, b_base, .. } = block;
    let nb = k.batch.len();
    let threads = t.threads();
    let (lda, ldb) = (t.bm, t.bn);
    let (sm, sk) = (k.lhs.strides[nb], k.lhs.strides[nb + 1]);
    let (skb, snb) = (k.rhs.strides[nb], k.rhs.strides[nb + 1]);
    let ak = e.value(Reg::B32, "rem.u32", &format!("{tid}, {}", t.bk));
    let am0 = e.value(Reg::B32, "div.u32", &format!("{tid}, {}", t.bk));
    let bn = e.value(Reg::B32, "rem.u32", &format!("{tid}, {}", t.bn));
    let bk0 = e.value(Reg::B32, "div.u32", &format!("{tid}, {}", t.bn));
    let loads_a = t.bm * t.bk / threads;
    let loads_b = t.bk * t.bn / threads;
    let a_sh = e.value(Reg::B32, "mov.u32", "gt_tile_a");
    let b_sh = e.value(Reg::B32, "mov.u32", "gt_tile_b");
    // A tile element at (`fixed`, `k`) of one operand: `fixed` is a row of A or a column of
    // B (bound and stride given), `k` the contracted index; its shared slot is `k * ld + local`.
    let tile_load = |e: &mut Emitter,
                     local: &str,
                     origin: &str,
                     bound: usize,
                     stride: i64,
                     k: &str,
                     k_stride: i64,
                     base: &str,
                     ld: usize,
                     sh: &str| {
        let fixed = e.value(Reg::B32, "add.s32", &format!("{origin}, {local}"));
        let in_range = e.predicate("lt.s32", &fixed, &bound.to_string());
        let fixed_off = e.value(Reg::B32, "mad.lo.s32", &format!("{fixed}, {stride}, {base}"));
        let offset = e.value(Reg::B32, "mad.lo.s32", &format!("{k}, {k_stride}, {fixed_off}"));
        let kk = e.value(Reg::B32, "mov.s32", k);
        let idx = e.value(Reg::B32, "mad.lo.s32", &format!("{k}, {ld}, {local}"));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{idx}, 4, {sh}"));
        Load { offset, in_range, k: kk, slot }
    };
    let a_loads: Vec<Load> = (0..loads_a)
        .map(|j| {
            let am = e.value(Reg::B32, "add.s32", &format!("{am0}, {}", j * threads / t.bk));
            tile_load(e, &am, row0, k.m, sm, &ak, sk, a_base, lda, &a_sh)
        })
        .collect();
    let b_loads: Vec<Load> = (0..loads_b)
        .map(|j| {
            let bk = e.value(Reg::B32, "add.s32", &format!("{bk0}, {}", j * threads / t.bn));
            tile_load(e, &bn, col0, k.n, snb, &bk, skb, b_base, ldb, &b_sh)
        })
        .collect();
    Tiles { a_loads, b_loads, a_sh, b_sh }
}

/// The FMA products: this thread's `tm x tn` accumulators and the code of a stage, which
/// reads its rows of A and columns of B from shared memory in vectors.
fn fma_products(e: &mut Emitter, t: Tiling, tid: &str, tiles: &Tiles) -> (Vec<Product>, Stage) {
    let Tiles { a_sh, b_sh, .. } = tiles;
    let (lda, ldb) = (t.bm, t.bn);
    let mut products: Vec<Product> = Vec::new();
    let tx = e.value(Reg::B32, "rem.u32", &format!("{tid}, {}", t.bn / t.tn));
    let ty = e.value(Reg::B32, "div.u32", &format!("{tid}, {}", t.bn / t.tn));
    let a_read = e.value(Reg::B32, "mad.lo.u32", &format!("{ty}, {}, {a_sh}", t.tm * 4));
    let b_read = e.value(Reg::B32, "mad.lo.u32", &format!("{tx}, {}, {b_sh}", t.tn * 4));
    let acc: Vec<Vec<String>> =
        (0..t.tm).map(|_| (0..t.tn).map(|_| e.value(Reg::F32, "mov.f32", &f32_imm(0.0))).collect()).collect();
    let row_base = e.value(Reg::B32, "mul.lo.u32", &format!("{ty}, {}", t.tm));
    let col_base = e.value(Reg::B32, "mul.lo.u32", &format!("{tx}, {}", t.tn));
    for (i, row) in acc.iter().enumerate() {
        for (j, c) in row.iter().enumerate() {
            products.push(Product { row: (row_base.clone(), i), col: (col_base.clone(), j), acc: c.clone() });
        }
    }
    let compute = Box::new(move |e: &mut Emitter| {
        for kk in 0..t.bk {
            let a = shared_vector(e, &a_read, kk * lda * 4, t.tm);
            let b = shared_vector(e, &b_read, kk * ldb * 4, t.tn);
            for (i, row) in acc.iter().enumerate() {
                for (j, c) in row.iter().enumerate() {
                    e.op(format!("fma.rn.f32 {c}, {}, {}, {c}", a[i], b[j]));
                }
            }
        }
    });
    (products, compute)
}

/// The loop over stages of `k`: store the staged loads to the shared tiles, fetch the next
/// stage, compute this one.
fn main_loop(
    e: &mut Emitter,
    k: &MatMulKernel,
    t: Tiling,
    block: &Block,
    tiles: &Tiles,
    compute: &dyn Fn(&mut Emitter),
) {
    let Block { a_ptr, b_ptr, .. } = block;
    let Tiles { a_loads, b_loads, .. } = tiles;
    let nb = k.batch.len();
    let (sk, skb) = (k.lhs.strides[nb + 1], k.rhs.strides[nb]);
    // Register double buffering: the next stage's global loads are issued before this
    // stage's products, so their latency hides behind the arithmetic.
    let fetch = |e: &mut Emitter, regs: &[String]| {
        let all = a_loads.iter().map(|l| (l, a_ptr)).chain(b_loads.iter().map(|l| (l, b_ptr)));
        for ((l, base), v) in all.zip(regs) {
            let k_ok = e.predicate("lt.s32", &l.k, &k.k.to_string());
            let ok = e.value(Reg::Pred, "and.pred", &format!("{k_ok}, {}", l.in_range));
            e.load_into(v, Some(&ok), base, &l.offset);
        }
    };
    let staged: Vec<String> = (0..a_loads.len() + b_loads.len()).map(|_| e.reg(Reg::F32)).collect();
    fetch(e, &staged);
    let stages = k.k.div_ceil(t.bk);
    let stage = e.value(Reg::B32, "mov.s32", "0");
    e.counted_loop(("stage", "stages_done"), &stage, stages, "1", |e| {
        for (l, v) in a_loads.iter().chain(b_loads).zip(&staged) {
            e.op(format!("st.shared.f32 [{}], {v}", l.slot));
        }
        e.op("bar.sync 0");
        for (loads, step) in [(a_loads, sk), (b_loads, skb)] {
            for l in loads.iter() {
                e.op(format!("add.s32 {o}, {o}, {}", step * t.bk as i64, o = l.offset));
                e.op(format!("add.s32 {k}, {k}, {}", t.bk, k = l.k));
            }
        }
        // Past the last stage the k bounds fail and nothing is read.
        fetch(e, &staged);
        compute(e);
        e.op("bar.sync 0");
    });
}

/// Writes each product element that is in bounds, through the epilogue if there is one.
pub(super) fn store(e: &mut Emitter, k: &MatMulKernel, block: &Block, products: &[Product]) {
    let Block { out, epi_ptrs, row0, col0, out_base, epi_bases, .. } = block;
    for Product { row: (row_base, dr), col: (col_base, dc), acc: c } in products {
        let r = e.value(Reg::B32, "add.s32", &format!("{row_base}, {dr}"));
        let r = e.value(Reg::B32, "add.s32", &format!("{r}, {row0}"));
        let col = e.value(Reg::B32, "add.s32", &format!("{col_base}, {dc}"));
        let col = e.value(Reg::B32, "add.s32", &format!("{col}, {col0}"));
        let row_ok = e.predicate("lt.s32", &r, &k.m.to_string());
        let row_off = e.value(Reg::B32, "mad.lo.s32", &format!("{r}, {}, {out_base}", k.n));
        let col_ok = e.predicate("lt.s32", &col, &k.n.to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{row_ok}, {col_ok}"));
        let off = e.value(Reg::B32, "add.s32", &format!("{row_off}, {col}"));
        let value = if k.epilogue.is_empty() {
            c.clone()
        } else {
            // The epilogue on this product element; its inputs are read only in bounds.
            let mut leaf = |e: &mut Emitter, l: Leaf| match l {
                Leaf::Input(i) => {
                    let a = &epi_bases[i as usize];
                    let (sr, sc) = (a.1[0], a.1[1]);
                    let o = e.value(Reg::B32, "mad.lo.s32", &format!("{r}, {sr}, {}", a.0));
                    let o = e.value(Reg::B32, "mad.lo.s32", &format!("{col}, {sc}, {o}"));
                    e.load_if(Some(&ok), &epi_ptrs[i as usize], &o)
                }
                Leaf::Acc => c.clone(),
                // Linear index of the output element (iota / random nodes).
                Leaf::Index => off.clone(),
            };
            e.eval(&k.epilogue, k.epilogue.len() - 1, &mut vec![None; k.epilogue.len()], &mut leaf)
        };
        e.store(Some(&ok), out, &off, &value);
    }
}

/// One product element a matmul thread accumulates: its row and column in the block tile,
/// each a base register plus a constant (few registers live through the main loop), and
/// its accumulator register.
pub(super) struct Product {
    pub(super) row: (String, usize),
    pub(super) col: (String, usize),
    pub(super) acc: String,
}

/// Loads `count` consecutive f32 from shared memory at `base + byte`, in v4/v2/v1 pieces.
fn shared_vector(e: &mut Emitter, base: &str, byte: usize, count: usize) -> Vec<String> {
    let mut regs = Vec::new();
    let mut i = 0;
    while i < count {
        let w = [4, 2, 1].into_iter().find(|&w| count - i >= w).unwrap_or(1);
        let rs: Vec<String> = (0..w).map(|_| e.reg(Reg::F32)).collect();
        let at = byte + i * 4;
        if w == 1 {
            e.op(format!("ld.shared.f32 {}, [{base}+{at}]", rs[0]));
        } else {
            e.op(format!("ld.shared.v{w}.f32 {{{}}}, [{base}+{at}]", rs.join(", ")));
        }
        regs.extend(rs);
        i += w;
    }
    regs
}
