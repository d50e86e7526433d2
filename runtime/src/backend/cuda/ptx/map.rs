//! Map kernels: the grid-stride loop (four elements per step with `v4` loads and stores when
//! every buffer allows it, else each element's coordinates dotted with the strides), and
//! maps that read along an axis other than the last, which go through 32x32 shared-memory
//! tiles so that reads and writes are both coalesced.

use super::emit::{Emitter, Reg};
use super::math::Leaf;
use super::{check, float32_only, pick, PtxError, PtxKernel};
use gt_ir::kernel::{Access, BufferStorage, MapKernel};

/// Threads per block of a grid-stride map.
const BLOCK: u32 = 256;
/// Grid-stride loops cap the grid here; more blocks than this add no parallelism.
const MAX_BLOCKS: usize = 65_535;

pub(super) fn map(k: &MapKernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    let n = k.numel();
    check(n)?;
    check(k.output.span(&k.shape))?;
    for a in &k.inputs {
        check(a.span(&k.shape))?;
    }
    let dims = &k.shape[..];
    // Vector loads and shared tiles hold f32s: other kernels go element by element.
    let float32 = float32_only(k, storage);
    if let Some(axis) = transposed_axis(k).filter(|_| float32) {
        return transpose(k, axis, storage);
    }
    let flat = |a: &Access| a.is_contiguous_over(dims) || a.is_uniform_over(dims);
    let vector = float32 && n.is_multiple_of(4) && k.output.is_contiguous_over(dims) && k.inputs.iter().all(flat);
    // 16 bytes per access: 4 f32, or 8 halves when every buffer read or written whole is one.
    let all_half = storage.output.is_half()
        && k.inputs.iter().zip(&storage.inputs).all(|(a, s)| s.is_half() || a.is_uniform_over(dims));
    let width = match vector {
        true if all_half && n.is_multiple_of(8) => 8,
        true => 4,
        false => 1,
    };
    let work = n / width;

    let mut e = Emitter::new(storage);
    e.computing(k.compute);
    let (out, inputs) = e.buffers(k.inputs.len());
    let (index, stride) = e.global_thread();
    e.counted_loop(("loop", "done"), &index, work, &stride, |e| map_body(e, k, width, &index, &out, &inputs));
    let blocks = work.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    let comment = format!("map of {n} elements, {width} per thread step");
    Ok(PtxKernel {
        text: e.finish(&comment, "", k.inputs.len() + 1),
        grid: (blocks, 1, 1),
        block: (BLOCK, 1, 1),
        shared: 0,
    })
}

/// One grid-stride step of a map: element `index`, or elements `width * index ..` when
/// `width` is 4 or 8.
fn map_body(e: &mut Emitter, k: &MapKernel, width: usize, index: &str, out: &str, inputs: &[String]) {
    let dims = &k.shape[..];
    if width > 1 {
        // Element indices width i .. width (i + 1), contiguous everywhere: vector loads and
        // one vector store.
        let first = e.value(Reg::B32, "shl.b32", &format!("{index}, {}", width.trailing_zeros()));
        let mut lanes: Vec<Vec<String>> = vec![Vec::new(); width];
        for (access, base) in k.inputs.iter().zip(inputs) {
            if access.is_contiguous_over(dims) {
                let regs = e.load_vec(base, &first, width);
                for (lane, r) in lanes.iter_mut().zip(regs) {
                    lane.push(r);
                }
            } else {
                let off = e.value(Reg::B32, "mov.s32", &access.offset.to_string());
                let r = e.load(base, &off);
                for lane in &mut lanes {
                    lane.push(r.clone());
                }
            }
        }
        let mut results = Vec::new();
        for (lane, loaded) in lanes.iter().enumerate() {
            let mut leaf = |e: &mut Emitter, l: Leaf| match l {
                Leaf::Input(i) => loaded[i as usize].clone(),
                _ => e.value(Reg::B32, "add.s32", &format!("{first}, {lane}")),
            };
            results.push(e.eval(&k.nodes, k.nodes.len() - 1, &mut vec![None; k.nodes.len()], &mut leaf));
        }
        e.store_vec(out, &first, &results);
    } else {
        let all_flat =
            k.inputs.iter().chain([&k.output]).all(|a| a.is_contiguous_over(dims) || a.is_uniform_over(dims));
        let coords = if all_flat { vec![None; dims.len()] } else { e.coords(index, dims) };
        let offset_of = |e: &mut Emitter, a: &Access| {
            if a.is_contiguous_over(dims) {
                index.to_string()
            } else {
                e.dot(a.offset, &coords, &a.strides)
            }
        };
        let mut loaded = Vec::new();
        for (access, base) in k.inputs.iter().zip(inputs) {
            let off = offset_of(e, access);
            loaded.push(e.load(base, &off));
        }
        let mut leaf = |_: &mut Emitter, l: Leaf| match l {
            Leaf::Input(i) => loaded[i as usize].clone(),
            _ => index.to_string(),
        };
        let value = e.eval(&k.nodes, k.nodes.len() - 1, &mut vec![None; k.nodes.len()], &mut leaf);
        let off = offset_of(e, &k.output);
        e.store(None, out, &off, &value);
    }
}

/// For a map whose output is contiguous and whose one non-uniform input is read with unit
/// stride along an axis other than the last (a transpose, or a permute moving the fastest
/// axis), that axis; such maps go through shared-memory tiles so that reads and writes are
/// both coalesced.
fn transposed_axis(k: &MapKernel) -> Option<usize> {
    let dims = &k.shape[..];
    let rank = dims.len();
    let last = rank.checked_sub(1)?;
    let mut strided = k.inputs.iter().filter(|a| !a.is_uniform_over(dims));
    let (input, None) = (strided.next()?, strided.next()) else { return None };
    let axis = (0..last).rev().find(|&a| input.strides[a] == 1 && dims[a] > 1)?;
    let batch: usize = (0..rank).filter(|&a| a != axis && a != last).map(|a| dims[a]).product();
    let tiled = k.output.is_contiguous_over(dims) && input.strides[last] != 1 && dims[last] >= 8 && dims[axis] >= 8;
    (tiled && batch <= 65_535 && dims[axis].div_ceil(TILE) <= 65_535).then_some(axis)
}

/// Tile side of the shared-memory transpose (a block is `TILE x 8` threads).
const TILE: usize = 32;

/// A map through 32x32 shared-memory tiles: a block reads a tile along the input's fast
/// axis (`axis`) and writes it along the output's (the last), both coalesced; the
/// expression is applied as the tile is written.
fn transpose(k: &MapKernel, axis: usize, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    let dims = &k.shape[..];
    let last = dims.len() - 1;
    let batch_axes: Vec<usize> = (0..dims.len()).filter(|&a| a != axis && a != last).collect();
    let batch_dims: Vec<usize> = batch_axes.iter().map(|&a| dims[a]).collect();
    let full = gt_ir::kernel::row_major_strides(dims);
    let mut e = Emitter::new(storage);
    let (out, inputs) = e.buffers(k.inputs.len());
    let (tx, ty) = (e.special("%tid.x"), e.special("%tid.y"));
    let (bx, by, bz) = (e.special("%ctaid.x"), e.special("%ctaid.y"), e.special("%ctaid.z"));
    let batch = e.coords(&bz, &batch_dims);
    let bases: Vec<String> = k.inputs.iter().map(|a| e.dot(a.offset, &batch, &pick(&a.strides, &batch_axes))).collect();
    let out_base = e.dot(k.output.offset, &batch, &pick(&k.output.strides, &batch_axes));
    let tile = e.value(Reg::B32, "mov.u32", "gt_tile");
    let a0 = e.value(Reg::B32, "mul.lo.u32", &format!("{by}, {TILE}"));
    let l0 = e.value(Reg::B32, "mul.lo.u32", &format!("{bx}, {TILE}"));
    let strided = k.inputs.iter().position(|a| !a.is_uniform_over(dims)).unwrap_or(0);
    let (sa, sl) = (k.inputs[strided].strides[axis], k.inputs[strided].strides[last]);
    // Read: threads along `axis` (unit stride), rows of the tile along `last`.
    let ai = e.value(Reg::B32, "add.u32", &format!("{a0}, {tx}"));
    let a_ok = e.predicate("lt.s32", &ai, &dims[axis].to_string());
    for j in 0..TILE / 8 {
        let li = e.value(Reg::B32, "add.u32", &format!("{l0}, {ty}"));
        let li = e.value(Reg::B32, "add.u32", &format!("{li}, {}", j * 8));
        let l_ok = e.predicate("lt.s32", &li, &dims[last].to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{a_ok}, {l_ok}"));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{ai}, {sa}, {}", bases[strided]));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{li}, {sl}, {off}"));
        let x = e.load_if(Some(&ok), &inputs[strided], &off);
        // tile[l][a], rows padded to TILE + 1 against bank conflicts.
        let row = e.value(Reg::B32, "add.u32", &format!("{ty}, {}", j * 8));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{row}, {}, {tx}", TILE + 1));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{slot}, 4, {tile}"));
        e.op(format!("st.shared.f32 [{slot}], {x}"));
    }
    e.op("bar.sync 0");
    // Write: threads along `last`.
    let lo = e.value(Reg::B32, "add.u32", &format!("{l0}, {tx}"));
    let l_ok = e.predicate("lt.s32", &lo, &dims[last].to_string());
    for j in 0..TILE / 8 {
        let row = e.value(Reg::B32, "add.u32", &format!("{ty}, {}", j * 8));
        let ao = e.value(Reg::B32, "add.u32", &format!("{a0}, {row}"));
        let a_ok = e.predicate("lt.s32", &ao, &dims[axis].to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{a_ok}, {l_ok}"));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{tx}, {}, {row}", TILE + 1));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{slot}, 4, {tile}"));
        let x = e.value(Reg::F32, "ld.shared.f32", &format!("[{slot}]"));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{ao}, {}, {out_base}", k.output.strides[axis]));
        let off = e.value(Reg::B32, "add.s32", &format!("{off}, {lo}"));
        let mut leaf = |e: &mut Emitter, l: Leaf| match l {
            Leaf::Input(i) if i as usize == strided => x.clone(),
            // Uniform inputs: the one element they read.
            Leaf::Input(i) => {
                let o = e.value(Reg::B32, "mov.s32", &k.inputs[i as usize].offset.to_string());
                e.load(&inputs[i as usize], &o)
            }
            _ => {
                // Linear index: the batch part plus this element's (axis, last) part.
                let b = e.dot(0, &batch, &pick(&full, &batch_axes));
                let i = e.value(Reg::B32, "mad.lo.s32", &format!("{ao}, {}, {b}", full[axis]));
                e.value(Reg::B32, "add.s32", &format!("{i}, {lo}"))
            }
        };
        let value = e.eval(&k.nodes, k.nodes.len() - 1, &mut vec![None; k.nodes.len()], &mut leaf);
        e.store(Some(&ok), &out, &off, &value);
    }
    let globals = format!(".shared .align 4 .b8 gt_tile[{}];\n\n", TILE * (TILE + 1) * 4);
    let comment = format!("tiled transpose of axis {axis} with the last, {TILE}x{TILE} tiles, {} elements", k.numel());
    let grid = (
        dims[last].div_ceil(TILE) as u32,
        dims[axis].div_ceil(TILE) as u32,
        batch_dims.iter().product::<usize>() as u32,
    );
    Ok(PtxKernel {
        text: e.finish(&comment, &globals, k.inputs.len() + 1),
        grid,
        block: (TILE as u32, 8, 1),
        shared: 0,
    })
}
