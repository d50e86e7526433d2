//! The CUDA backend on a GPU (built with `--features cuda`): every filetest and random
//! programs run on the GPU and the interpreter at once ([`gt::mirror::Mirror`]) with every
//! read compared; the steady state allocates nothing; errors name their cause; workers on
//! CUDA serve clients. Without a GPU each test says so and passes, unless
//! `GT_REQUIRE_GPU=1` (set on the GPU machine) makes that a failure. Without a GPU the CLI
//! test checks that `gt worker --backend cuda` exits 2 with one clear line.

use gt::mirror::{Mirror, MirrorError, Tolerance};
use gt::script::{load, run_on};
use gt_frontend::script::RunOptions;
use gt_ir::kernel::{samples, Kernel};
use gt_ir::random::normal;
use gt_ir::{BinaryOp, DType, Executor, Instr, Operand, ReduceOp, TensorType, UnaryOp, ValueId};
use gt_runtime::backend::cpu::kernels;
use gt_runtime::backend::cuda::CudaBackend;
use gt_runtime::backend::{Backend, BackendError};
use proptest::prelude::*;
use std::path::Path;

/// A backend on device 0, or `None` (after saying why) when this machine has no GPU.
fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0, 8 << 30) {
        Ok(b) => Some(b),
        Err(BackendError::Unavailable(why)) if std::env::var_os("GT_REQUIRE_GPU").is_none() => {
            eprintln!("skipped: {why}");
            None
        }
        Err(e) => panic!("GT_REQUIRE_GPU is set but: {e}"),
    }
}

#[test]
fn every_filetest_and_example_gives_the_interpreters_output() {
    let Some(first) = gpu() else { return };
    println!("device: {}", first.device_name());
    drop(first);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let report = gt::mirror::check_scripts(root, &mut || Box::new(gpu().unwrap()), Tolerance::default());
    println!("{}", report.summary());
    assert!(report.failures.is_empty(), "{}", report.failures.join("\n\n"));
}

fn v(i: u32) -> ValueId {
    ValueId(i)
}

/// Runs `instrs` mirrored and reads every value they define.
fn mirrored(instrs: &[Instr]) -> Result<(), String> {
    mirrored_within(instrs, Tolerance::default())
}

/// Matmul results of N(0, 1) operands: each side's f32 sum of `k` products carries a
/// rounding error growing with `k` (compared to the terms, not to the possibly tiny sum).
fn matmul_tolerance(k: usize) -> Tolerance {
    Tolerance { abs: 1e-5 + 1e-6 * k as f32, rel: 1e-4 }
}

fn mirrored_within(instrs: &[Instr], tolerance: Tolerance) -> Result<(), String> {
    let Some(gpu) = gpu() else { return Ok(()) };
    let mut m = Mirror::new(Box::new(gpu), tolerance);
    // A program both refuse is the program's own error (say "both", callers may accept it).
    let say = |op: &str, e: MirrorError| match e {
        MirrorError::Both(e) => format!("{op}: both refuse: {e}"),
        e => format!("{op}: {e}"),
    };
    for i in instrs {
        m.execute(i).map_err(|e| say(i.mnemonic(), e))?;
    }
    for i in instrs {
        for r in i.results() {
            m.read(r).map_err(|e| say("get", e))?;
        }
    }
    Ok(())
}

/// Shapes that broadcast together: a result shape and two operand shapes that are it with
/// some dims set to 1 or dropped from the front.
fn broadcast_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>)> {
    (prop::collection::vec(1usize..9, 0..4), any::<u32>(), any::<u32>()).prop_map(|(dims, ma, mb)| {
        let squash = |mask: u32| -> Vec<usize> {
            let keep = dims.len() - (mask as usize % (dims.len() + 1));
            dims[dims.len() - keep..]
                .iter()
                .enumerate()
                .map(|(i, &d)| if mask >> (i + 3) & 1 == 1 { 1 } else { d })
                .collect()
        };
        (dims.clone(), squash(ma), squash(mb))
    })
}

const UNARY: [UnaryOp; 9] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Relu,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random elementwise chains over broadcasting shapes, then a reduction over random
    /// axes: the GPU equals the interpreter.
    #[test]
    fn random_elementwise_and_reduction_programs(
        (_, a, b) in broadcast_shapes(),
        seed in any::<u64>(),
        ops in prop::collection::vec((0usize..13, 0usize..9), 1..6),
        reduce in 0usize..4,
        axes_mask in any::<u32>(),
        keepdim in any::<bool>(),
    ) {
        let mut instrs = vec![
            Instr::Randn { dst: v(0), ty: TensorType::f32(a.clone()), seed },
            Instr::Rand { dst: v(1), ty: TensorType::f32(b.clone()), seed: seed ^ 1 },
        ];
        let mut last = 0;
        for (i, &(bin, un)) in ops.iter().enumerate() {
            let dst = 2 + 2 * i as u32;
            let op = BinaryOp::ALL[bin];
            // Keep pow's base positive (rand) so it stays real.
            let (lhs, rhs) = if op == BinaryOp::Pow { (v(1), v(last)) } else { (v(last), v(1)) };
            instrs.push(Instr::Binary { dst: v(dst), op, lhs: Operand::Value(lhs), rhs: Operand::Value(rhs) });
            // Log/sqrt/rsqrt of negatives give NaN on both: compared as NaN.
            instrs.push(Instr::Unary { dst: v(dst + 1), op: UNARY[un], src: v(dst) });
            last = dst + 1;
        }
        let rank = a.len().max(b.len()) as i64;
        let axes: Vec<i64> = (0..rank).filter(|i| axes_mask >> i & 1 == 1).collect();
        instrs.push(Instr::Reduce {
            dst: v(1000),
            op: ReduceOp::ALL[reduce],
            src: v(last),
            axes: if axes_mask & 1 << 10 != 0 { None } else { Some(axes) },
            keepdim,
        });
        // Max/min over an empty axis is refused by both: skip those programs.
        match mirrored(&instrs) {
            Err(e) if e.contains("both") || e.contains("empty") => {}
            r => prop_assert!(r.is_ok(), "{}", r.unwrap_err()),
        }
    }

    /// Batched, broadcast and vector matmuls of random sizes, including tile edges.
    #[test]
    fn random_matmuls(m in 1usize..150, k in 1usize..150, n in 1usize..150, batch in 0usize..3, vector in 0usize..3) {
        let lhs = match (vector, batch) {
            (1, _) => vec![k],
            (_, 0) => vec![m, k],
            (_, b) => vec![b, m, k],
        };
        let rhs = if vector == 2 { vec![k] } else { vec![k, n] };
        let instrs = vec![
            Instr::Randn { dst: v(0), ty: TensorType::f32(lhs), seed: 1 },
            Instr::Randn { dst: v(1), ty: TensorType::f32(rhs), seed: 2 },
            Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) },
        ];
        let r = mirrored_within(&instrs, matmul_tolerance(k));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

/// Runs `kernel` on the GPU and on the CPU kernel oracle with N(0, 1) inputs of these
/// lengths; compares the `out_len` results.
fn kernel_agrees(kernel: &Kernel, input_lens: &[usize], out_len: usize, tolerance: Tolerance) {
    let Some(mut gpu) = gpu() else { return };
    let inputs: Vec<Vec<f32>> = input_lens
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n as u64).map(|j| normal(i as u64 + 10, j)).collect())
        .collect();
    for (i, data) in inputs.iter().enumerate() {
        let ty = TensorType::f32(vec![data.len()]);
        gpu.execute(&Instr::Literal { dst: v(i as u32), ty, data: data.clone().into() }).unwrap();
    }
    let ids: Vec<ValueId> = (0..inputs.len() as u32).map(v).collect();
    gpu.run_kernel(kernel, &ids, v(100), TensorType::f32(vec![out_len])).unwrap();
    let got = gpu.read(v(100)).unwrap().to_f32();
    let mut want = vec![0.0; out_len];
    let refs: Vec<&[f32]> = inputs.iter().map(|d| &d[..]).collect();
    kernels::run(kernel, &refs, &mut want).unwrap();
    if let Some(i) = (0..out_len).find(|&i| !tolerance.accepts(got[i], want[i])) {
        panic!("element {i}: gpu {} vs oracle {}\n{kernel}", got[i], want[i]);
    }
}

#[test]
fn fused_row_kernels_agree_with_the_oracle() {
    // Rows kept in registers (784, 33), and looped over (20000 > 16 per thread).
    for dims in [vec![64, 784], vec![5, 33], vec![3, 20_000], vec![1, 1]] {
        let n = dims.iter().product();
        kernel_agrees(&samples::softmax(&dims), &[n], n, Tolerance::default());
        kernel_agrees(&samples::layer_norm(&dims, 1e-5), &[n], n, Tolerance { abs: 1e-4, rel: 1e-4 });
    }
    kernel_agrees(&samples::gelu(&[1001]), &[1001], 1001, Tolerance::default());
    // Rows along outer axes, and a final reduction after an in-row one (log-sum-exp's sum).
    let Kernel::Map(mut k) = samples::softmax(&[6, 5, 7]) else { unreachable!() };
    k.rows = vec![0, 2];
    kernel_agrees(&Kernel::Map(k.clone()), &[210], 210, Tolerance::default());
    k.nodes.truncate(4);
    k.reduce = Some(ReduceOp::Sum);
    k.output.strides = vec![0, 1, 0];
    kernel_agrees(&Kernel::Map(k), &[210], 5, Tolerance::default());
}

#[test]
fn matmul_epilogues_agree_with_the_oracle() {
    for (m, k, n) in [(64, 784, 256), (130, 70, 90), (1, 5, 1), (2048, 512, 2048)] {
        kernel_agrees(&samples::linear_relu(m, k, n), &[m * k, k * n, n], m * n, matmul_tolerance(k));
    }
}

#[test]
fn tf32_tensor_core_matmuls_agree_within_tf32_rounding() {
    // On an H100 the aligned ones run on warpgroups after B is transposed (tails in every
    // dimension, and both block tiles), the others on mma.sync.
    for (m, k, n) in [(64, 784, 256), (130, 70, 90), (1, 5, 1), (1024, 1024, 1024), (200, 264, 520), (2304, 256, 4096)]
    {
        let Kernel::MatMul(mut mm) = samples::linear_relu(m, k, n) else { unreachable!() };
        mm.precision = gt_ir::kernel::Precision::Tf32;
        // Operands keep 10 mantissa bits: ~5e-4 relative per product, growing with depth.
        let tolerance = Tolerance { abs: 2e-3 * (k as f32).sqrt(), rel: 2e-3 };
        kernel_agrees(&Kernel::MatMul(mm.clone()), &[m * k, k * n, n], m * n, tolerance);
        mm.epilogue.clear();
        mm.epilogue_inputs.clear();
        kernel_agrees(&Kernel::MatMul(mm), &[m * k, k * n], m * n, tolerance);
    }
}

#[test]
fn long_reductions_in_two_passes_agree() {
    for op in ReduceOp::ALL {
        let instrs = vec![
            Instr::Randn { dst: v(0), ty: TensorType::f32(vec![2, 1 << 20]), seed: 4 },
            Instr::Reduce { dst: v(1), op: *op, src: v(0), axes: Some(vec![-1]), keepdim: false },
            Instr::Reduce { dst: v(2), op: *op, src: v(0), axes: None, keepdim: true },
        ];
        // f32 sums of 2^20 terms in different orders: compared to the terms' scale.
        mirrored_within(&instrs, Tolerance { abs: 2e-3, rel: 1e-4 }).unwrap();
    }
}

#[test]
fn tiled_transposes_agree() {
    // 2-d and batched, ragged tile edges, with an elementwise op fused into the copy.
    let cases: [(Vec<usize>, Vec<i64>); 4] = [
        (vec![70, 45], vec![1, 0]),
        (vec![3, 40, 33], vec![0, 2, 1]),
        (vec![33, 9, 64], vec![2, 1, 0]),
        (vec![8, 8], vec![1, 0]),
    ];
    for (dims, perm) in cases {
        let instrs = vec![
            Instr::Randn { dst: v(0), ty: TensorType::f32(dims), seed: 3 },
            Instr::Permute { dst: v(1), src: v(0), perm },
        ];
        mirrored(&instrs).unwrap();
    }
}

#[test]
fn large_matmul_uses_big_tiles_and_agrees() {
    let instrs = vec![
        Instr::Randn { dst: v(0), ty: TensorType::f32(vec![1030, 517]), seed: 1 },
        Instr::Randn { dst: v(1), ty: TensorType::f32(vec![517, 1100]), seed: 2 },
        Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) },
    ];
    mirrored_within(&instrs, matmul_tolerance(517)).unwrap();
}

/// N(0, 1) operands of these shapes in `dtype` (made on the host: the GPU's `randn` differs
/// from the CPU's in the last bits, which can round an input to another half), their matmul
/// (after `lhs_t`/`rhs_t` transposes), a bias add and a relu in `dtype`.
fn half_matmul(dtype: DType, (a, b): (&[usize], &[usize]), (lhs_t, rhs_t): (bool, bool)) -> Vec<Instr> {
    let literal = |dst: u32, dims: &[usize], stream: u64| {
        let n: usize = dims.iter().product();
        let x: Vec<f64> = (0..n as u64).map(|j| f64::from(normal(stream, j))).collect();
        let data = gt_ir::data::Elements::from_f64s(dtype, &x);
        Instr::Literal { dst: v(dst), ty: TensorType::new(dtype, dims.to_vec()), data }
    };
    let mut instrs = vec![literal(2, a, 1), literal(3, b, 2)];
    let (mut l, mut r) = (v(2), v(3));
    if lhs_t {
        instrs.push(Instr::Transpose { dst: v(4), src: l, dim0: -2, dim1: -1 });
        l = v(4);
    }
    if rhs_t {
        instrs.push(Instr::Transpose { dst: v(5), src: r, dim0: -2, dim1: -1 });
        r = v(5);
    }
    // The result's columns: b's last axis, or its first when transposed.
    let n = if rhs_t { b[b.len() - 2] } else { b[b.len() - 1] };
    instrs.extend([
        Instr::MatMul { dst: v(6), lhs: l, rhs: r },
        literal(7, &[n], 3),
        Instr::Binary { dst: v(8), op: BinaryOp::Add, lhs: Operand::Value(v(6)), rhs: Operand::Value(v(7)) },
        Instr::Unary { dst: v(9), op: UnaryOp::Relu, src: v(8) },
    ]);
    instrs
}

#[test]
fn half_precision_matmuls_run_on_tensor_cores_and_agree() {
    // Aligned rows (cp.async), odd sizes and tails (element loads), transposed operands,
    // and a batch; results rounded once to the half type, so one ulp apart is equal.
    type Case = (&'static [usize], &'static [usize], (bool, bool));
    let cases: [Case; 6] = [
        (&[256, 512], &[512, 256], (false, false)),
        (&[130, 70], &[70, 90], (false, false)),
        (&[1, 5], &[5, 1], (false, false)),
        (&[512, 1024], &[512, 1024], (true, false)),
        (&[300, 200], &[264, 200], (false, true)),
        (&[3, 128, 64], &[3, 64, 136], (false, false)),
    ];
    for dtype in [DType::BF16, DType::F16] {
        for (a, b, t) in cases {
            // Products of N(0, 1) terms are about sqrt(k) in size, and the matmul's result is
            // rounded to the half type before the bias is added: one ulp of that size can
            // survive the cancellation (a wrong fragment would be off by about sqrt(k)).
            let k = if t.0 { a[0] } else { a[a.len() - 1] };
            let tolerance = Tolerance { abs: (k as f32).sqrt() / 64.0, rel: 1e-4 };
            let instrs = half_matmul(dtype, (a, b), t);
            mirrored_within(&instrs, tolerance).unwrap_or_else(|e| panic!("{dtype:?} {a:?} {b:?} {t:?}: {e}"));
        }
    }
}

#[test]
fn half_precision_maps_rows_and_reductions_agree() {
    // Casts both ways, a vectorised chain, a row kernel (softmax), reductions in two passes,
    // a transpose through shared tiles: every buffer of them in the half type.
    for dtype in [DType::BF16, DType::F16] {
        let h = |dims: Vec<usize>| TensorType::new(dtype, dims);
        let instrs = vec![
            Instr::Randn { dst: v(0), ty: h(vec![64, 1000]), seed: 5 },
            Instr::Unary { dst: v(1), op: UnaryOp::Tanh, src: v(0) },
            Instr::Binary { dst: v(2), op: BinaryOp::Mul, lhs: Operand::Value(v(1)), rhs: Operand::Scalar(3.0) },
            Instr::Binary { dst: v(3), op: BinaryOp::Sub, lhs: Operand::Value(v(2)), rhs: Operand::Value(v(1)) },
            Instr::Reduce { dst: v(4), op: ReduceOp::Sum, src: v(2), axes: None, keepdim: false },
            Instr::Reduce { dst: v(5), op: ReduceOp::Max, src: v(0), axes: Some(vec![0]), keepdim: false },
            Instr::Cast { dst: v(6), src: v(2), dtype: DType::F32 },
            Instr::Transpose { dst: v(7), src: v(0), dim0: 0, dim1: 1 },
            Instr::Binary { dst: v(8), op: BinaryOp::Add, lhs: Operand::Value(v(6)), rhs: Operand::Value(v(0)) },
        ];
        // The full sum's terms are up to 3 and 64000 of them: compared to that scale.
        mirrored_within(&instrs, Tolerance { abs: 0.5, rel: 1e-4 }).unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
    }
}

/// [`kernel_agrees`] with every buffer stored as `dtype`: the inputs are N(0, 1) rounded to
/// it, the oracle computes on them in f32 and its results are rounded to it.
fn half_kernel_agrees(kernel: &Kernel, input_lens: &[usize], out_len: usize, dtype: DType, tolerance: Tolerance) {
    use gt_ir::data::Elements;
    let Some(mut gpu) = gpu() else { return };
    let inputs: Vec<Elements> = input_lens
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let x: Vec<f64> = (0..n as u64).map(|j| f64::from(normal(i as u64 + 10, j))).collect();
            Elements::from_f64s(dtype, &x)
        })
        .collect();
    for (i, data) in inputs.iter().enumerate() {
        let ty = TensorType::new(dtype, vec![data.len()]);
        gpu.execute(&Instr::Literal { dst: v(i as u32), ty, data: data.clone() }).unwrap();
    }
    let ids: Vec<ValueId> = (0..inputs.len() as u32).map(v).collect();
    gpu.run_kernel(kernel, &ids, v(100), TensorType::new(dtype, vec![out_len])).unwrap();
    let got = gpu.read(v(100)).unwrap().to_f32();
    let mut want = vec![0.0; out_len];
    let widened: Vec<Vec<f32>> = inputs.iter().map(Elements::to_f32).collect();
    let refs: Vec<&[f32]> = widened.iter().map(|d| &d[..]).collect();
    kernels::run(kernel, &refs, &mut want).unwrap();
    let want = Elements::from(want).cast(dtype).to_f32();
    let tolerance = tolerance.for_dtype(dtype);
    if let Some(i) = (0..out_len).find(|&i| !tolerance.accepts(got[i], want[i])) {
        panic!("{dtype:?} element {i}: gpu {} vs oracle {}\n{kernel}", got[i], want[i]);
    }
}

#[test]
fn half_precision_kernels_agree_with_the_oracle() {
    use gt_ir::kernel::Access;
    for dtype in [DType::BF16, DType::F16] {
        // A row kernel and a map, loading and storing halves.
        for dims in [vec![64, 784], vec![3, 20_000]] {
            let n = dims.iter().product();
            half_kernel_agrees(&samples::softmax(&dims), &[n], n, dtype, Tolerance::default());
        }
        half_kernel_agrees(&samples::gelu(&[1001]), &[1001], 1001, dtype, Tolerance::default());
        // Tensor-core matmuls whose operands take each load path: aligned rows (cp.async),
        // a transposed lhs (threads along m), a transposed rhs (threads along k), odd k.
        let (m, k, n) = (200, 264, 136);
        let Kernel::MatMul(mm) = samples::linear_relu(m, k, n) else { unreachable!() };
        let mut lhs_t = mm.clone();
        lhs_t.lhs = Access { offset: 0, strides: vec![1, m as i64] };
        let mut rhs_t = mm.clone();
        rhs_t.rhs = Access { offset: 0, strides: vec![1, k as i64] };
        let mut odd = mm.clone();
        odd.k = 261;
        odd.lhs = Access { offset: 0, strides: vec![261, 1] };
        for (case, kk) in [(mm, k), (lhs_t, k), (rhs_t, k), (odd, 261)] {
            let lens = [m * kk.max(k), kk.max(k) * n, n];
            half_kernel_agrees(&Kernel::MatMul(case), &lens, m * n, dtype, matmul_tolerance(kk));
        }
    }
}

#[test]
fn a_second_backend_loads_its_kernels_from_the_disk_cache() {
    use gt_runtime::backend::cuda::cache::KernelCache;
    let dir = std::env::temp_dir().join(format!("gt-cuda-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let instrs = half_matmul(DType::BF16, (&[256, 512], &[512, 256]), (false, false));
    let run = || {
        let mut g = gpu()?;
        g.set_kernel_cache(KernelCache::at(&dir));
        for i in &instrs {
            g.execute(i).unwrap();
        }
        let out = g.read(v(9)).unwrap();
        Some((g.counters(), out))
    };
    let Some((cold, first)) = run() else { return };
    let files = std::fs::read_dir(&dir).unwrap().count() as u64;
    assert_eq!((cold.disk_hits, files), (0, cold.compiles), "{cold:?}");
    let (warm, second) = run().unwrap();
    assert_eq!((warm.compiles, warm.disk_hits), (cold.compiles, cold.compiles), "{warm:?}");
    assert_eq!(first, second);
    // A damaged file is compiled again and replaced, not an error.
    for f in std::fs::read_dir(&dir).unwrap() {
        std::fs::write(f.unwrap().path(), b"not a cubin").unwrap();
    }
    let (damaged, third) = run().unwrap();
    assert_eq!((damaged.compiles, damaged.disk_hits), (cold.compiles, 0), "{damaged:?}");
    assert_eq!(first, third);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_steady_loop_allocates_and_compiles_nothing_new() {
    let Some(mut gpu) = gpu() else { return };
    let step = |g: &mut CudaBackend, i: u32| {
        let base = 10 + 10 * i;
        let run = |g: &mut CudaBackend, instr: Instr| g.execute(&instr).unwrap();
        run(g, Instr::MatMul { dst: v(base), lhs: v(0), rhs: v(1) });
        run(g, Instr::Unary { dst: v(base + 1), op: UnaryOp::Relu, src: v(base) });
        run(g, Instr::Reduce { dst: v(base + 2), op: ReduceOp::Mean, src: v(base + 1), axes: None, keepdim: false });
        run(g, Instr::Free { src: v(base) });
        run(g, Instr::Free { src: v(base + 1) });
        run(g, Instr::Free { src: v(base + 2) });
    };
    gpu.execute(&Instr::Randn { dst: v(0), ty: TensorType::f32(vec![64, 784]), seed: 1 }).unwrap();
    gpu.execute(&Instr::Randn { dst: v(1), ty: TensorType::f32(vec![784, 256]), seed: 2 }).unwrap();
    for i in 0..10 {
        step(&mut gpu, i);
    }
    gpu.finish().unwrap();
    let after_10 = gpu.counters();
    for i in 10..1000 {
        step(&mut gpu, i);
    }
    gpu.finish().unwrap();
    let after_1000 = gpu.counters();
    assert_eq!(after_10.allocations, after_1000.allocations, "{after_10:?} -> {after_1000:?}");
    assert_eq!(after_10.compiles, after_1000.compiles);
    assert_eq!(after_1000.launches - after_10.launches, 990 * 3);
    assert_eq!(gpu.live_values(), 2);
}

#[test]
fn out_of_memory_names_the_request() {
    let Some(mut gpu) = gpu() else { return };
    // 4 GiB tensors until the device is full (no GPU holds 64 of them).
    let ty = TensorType::f32(vec![1 << 30]);
    let mut failure = None;
    for i in 0..64 {
        if let Err(e) = gpu.execute(&Instr::Zeros { dst: v(i), ty: ty.clone() }) {
            failure = Some((i, e.to_string()));
            break;
        }
    }
    let (held, text) = failure.expect("the device filled up");
    assert!(text.contains("cannot allocate 4294967296 bytes"), "{text}");
    assert!(text.contains(&format!("{held} values hold")), "{text}");
    for i in 0..held {
        gpu.execute(&Instr::Free { src: v(i) }).unwrap();
    }
    // The backend is still usable.
    gpu.execute(&Instr::Ones { dst: v(100), ty: TensorType::f32(vec![3]) }).unwrap();
    assert_eq!(gpu.read(v(100)).unwrap().to_f32(), vec![1.0; 3]);
}

#[test]
fn too_many_elements_for_32_bit_indexing_is_an_error() {
    let Some(mut gpu) = gpu() else { return };
    // 2^31 elements (8 GiB, within the memory limit): refused before anything is allocated.
    let e = gpu.execute(&Instr::Zeros { dst: v(1), ty: TensorType::f32(vec![1 << 16, 1 << 15]) }).unwrap_err();
    assert!(e.to_string().contains("32-bit indexing"), "{e}");
    assert_eq!(gpu.counters().allocations, 0);
}

#[test]
fn embedded_cluster_on_cuda_runs_a_script_like_the_interpreter() {
    let Some(_) = gpu() else { return };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mlp.gtir");
    let want = std::process::Command::new(env!("CARGO_BIN_EXE_gt-run")).arg("--reference").arg(&path).output().unwrap();
    let got = std::process::Command::new(env!("CARGO_BIN_EXE_gt-run"))
        .arg("--worker-stats")
        .arg(&path)
        .env("GT_BACKEND", "cuda")
        .env("GT_WORKERS", "2")
        .output()
        .unwrap();
    let (want, got_text) = (String::from_utf8_lossy(&want.stdout), String::from_utf8_lossy(&got.stdout));
    let stats = String::from_utf8_lossy(&got.stderr);
    assert!(got.status.success(), "{stats}");
    // Printed with 4 significant digits: the GPU's last-bit differences do not show.
    assert_eq!(got_text, want);
    assert!(stats.contains("cuda"), "worker stats name the backend: {stats}");
}

#[test]
fn cuda_worker_without_a_gpu_exits_2_with_one_line() {
    if CudaBackend::new(0, 1).is_ok() {
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gt"))
        .args(["worker", "--backend", "cuda", "-p", "9", "--wait", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CUDA is not available"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gt-run"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mlp.gtir"))
        .env("GT_BACKEND", "cuda")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("CUDA is not available"), "{err}");
}

#[test]
fn script_on_the_gpu_directly() {
    let Some(gpu) = gpu() else { return };
    let source =
        b"%x = arange f32 end=8\n%y = reshape %x shape=[2, 4]\n%s = sum %y axes=[1]\nexpect %s == f32[2] [6, 22]\n";
    let loaded = load(source).unwrap();
    let mut m = Mirror::new(Box::new(gpu), Tolerance::default());
    run_on(&loaded, &mut m, &mut std::io::sink(), RunOptions::default()).unwrap();
}

/// Timed batches report device times from CUDA events: one per instruction run, in order,
/// not overlapping (one stream), within the batch's wall time, the matmul the longest.
#[test]
fn timed_batches_report_device_times() {
    let Some(mut gpu) = gpu() else { return };
    let epoch = std::time::Instant::now();
    let n = 1024;
    let instrs = [
        Instr::Randn { dst: v(0), ty: TensorType::f32(vec![n, n]), seed: 1 },
        Instr::Randn { dst: v(1), ty: TensorType::f32(vec![n, n]), seed: 2 },
        Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) },
        Instr::Unary { dst: v(3), op: UnaryOp::Relu, src: v(2) },
    ];
    // Warm up (module loads are not what is timed).
    for i in &instrs {
        gpu.execute(i).unwrap();
    }
    gpu.finish().unwrap();
    let before = epoch.elapsed().as_nanos() as u64;
    gpu.start_timing(epoch);
    for i in &instrs {
        gpu.execute(i).unwrap();
    }
    gpu.finish().unwrap();
    let after = epoch.elapsed().as_nanos() as u64;
    let t = gpu.take_timings().expect("device times");
    assert_eq!(t.len(), instrs.len());
    for w in t.windows(2) {
        assert!(w[0].start + w[0].nanos <= w[1].start + 1_000, "in order, one at a time: {t:?}");
    }
    assert!(t[0].start >= before && t[3].start + t[3].nanos <= after + 1_000_000, "{before} {t:?} {after}");
    assert!(t[2].nanos > t[3].nanos && t[2].nanos > 0, "the matmul takes longest: {t:?}");
    // Untimed again: nothing reported.
    gpu.execute(&instrs[3]).unwrap();
    gpu.finish().unwrap();
    assert_eq!(gpu.take_timings(), None);
}

#[test]
fn warpgroup_matmuls_agree() {
    // On an H100 half matmuls with aligned rows run on warpgroups (wgmma): both block tiles
    // (128x256 where the product has enough of them, else 128x128), tails in m, n and a k
    // that is not a multiple of the 64-deep stage, a batch, a one-block product. On other
    // GPUs these take mma.sync and must agree all the same.
    type Case = (&'static [usize], &'static [usize]);
    let cases: [Case; 5] = [
        (&[2304, 256], &[256, 4096]),
        (&[200, 264], &[264, 520]),
        (&[2, 192, 328], &[2, 328, 72]),
        (&[64, 8], &[8, 8]),
        (&[1000, 1000], &[1000, 1000]),
    ];
    for dtype in [DType::BF16, DType::F16] {
        for (a, b) in cases {
            let k = a[a.len() - 1];
            let tolerance = Tolerance { abs: (k as f32).sqrt() / 64.0, rel: 1e-4 };
            let instrs = half_matmul(dtype, (a, b), (false, false));
            mirrored_within(&instrs, tolerance).unwrap_or_else(|e| panic!("{dtype:?} {a:?} {b:?}: {e}"));
        }
    }
}

#[test]
fn large_uploads_and_reads_keep_every_byte_pinned_or_not() {
    // 40 MB of f32 (two and a half pinned chunks) and an odd count of bf16, each uploaded and
    // read back through the pinned chunks and through pageable memory; between them a kernel
    // reads the value, so a read waits for the work queued before it.
    use gt_ir::data::Elements;
    for pinned in [true, false] {
        let Some(mut gpu) = gpu() else { return };
        gpu.set_pinned(pinned);
        let n = 10_000_003;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let halves: Vec<f64> = (0..n as u64 / 2).map(|i| f64::from(normal(3, i))).collect();
        let b = Elements::from_f64s(DType::BF16, &halves);
        let instrs = [
            Instr::Literal { dst: v(0), ty: TensorType::f32(vec![n]), data: Elements::F32(x.clone()) },
            Instr::Literal { dst: v(1), ty: TensorType::new(DType::BF16, vec![halves.len()]), data: b.clone() },
            Instr::Unary { dst: v(2), op: UnaryOp::Neg, src: v(0) },
        ];
        for i in &instrs {
            gpu.execute(i).unwrap();
        }
        assert_eq!(gpu.read(v(0)).unwrap().to_f32(), x, "pinned {pinned}");
        assert_eq!(gpu.read(v(1)).unwrap().data, b, "pinned {pinned}");
        let neg: Vec<f32> = x.iter().map(|v| -v).collect();
        assert_eq!(gpu.read(v(2)).unwrap().to_f32(), neg, "pinned {pinned}");
    }
}

#[test]
fn fused_halves_on_a_cuda_worker_round_once_like_the_cpu() {
    // A bf16 chain that the fuse pass makes one kernel: on the GPU (kernel over bf16
    // buffers, computed in f32, rounded once) it prints what the CPU's fused kernel prints,
    // which differs from the eager run's (rounded after every op) in the last bits.
    let Some(_) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("gt-cuda-fused-halves-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("chain.gtir");
    std::fs::write(
        &path,
        "%x = tensor bf16[2, 4] [[0.5, -1.25, 2, 3.5], [-0.75, 1, 0.125, -2]]\n%a = mul %x, 1.5\n\
         %b = add %a, 0.25\n%c = tanh %b\n%d = exp %c\n%e = sub %d, 1\n%f = mul %e, %x\nprint %f\n",
    )
    .unwrap();
    let run = |backend: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gt-run"))
            .arg("--pass-stats")
            .arg(&path)
            .env("GT_BACKEND", backend)
            .env("GT_COMPILE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{backend}: {stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    let (cpu, _) = run("cpu");
    let (gpu_out, stats) = run("cuda");
    let eager =
        std::process::Command::new(env!("CARGO_BIN_EXE_gt-run")).arg("--reference").arg(&path).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(stats.contains("kernels=1"), "one fused kernel: {stats}");
    assert_eq!(gpu_out, cpu);
    assert_ne!(gpu_out, String::from_utf8_lossy(&eager.stdout), "fused and eager round differently here");
}

#[path = "../common/dtype_program.rs"]
mod dtype_program;

/// Every dtype on the GPU (`dtype_program`) gives the interpreter's values, integers and
/// `f64`'s `exp log tanh sigmoid erf` (`gt_ir::math64`, emitted as PTX) exactly.
/// `tests/gtir/run/dtype_kernels.gtir` goes through the GPU too, in the every-filetest test.
#[test]
fn every_dtype_computes_like_the_interpreter() {
    let (exact, sums) = dtype_program::dtype_program();
    mirrored_within(&exact, Tolerance { abs: 0.0, rel: 0.0 }).unwrap();
    let mut with_sums: Vec<Instr> = exact.into_iter().filter(|i| !matches!(i, Instr::Reduce { .. })).collect();
    with_sums.extend(sums);
    mirrored_within(&with_sums, Tolerance { abs: 0.0, rel: 1e-12 }).unwrap();
}

/// What the GPU does not compute is refused by name, before anything runs.
#[test]
fn integer_products_are_refused_by_name() {
    let Some(mut gpu) = gpu() else { return };
    let m = TensorType::new(DType::I64, vec![2, 2]);
    gpu.execute(&Instr::Ones { dst: v(2), ty: m }).unwrap();
    let e = gpu.execute(&Instr::MatMul { dst: v(3), lhs: v(2), rhs: v(2) }).unwrap_err();
    assert!(e.to_string().contains("does not compute it in i64"), "{e}");
    // Still usable.
    gpu.execute(&Instr::Cast { dst: v(4), src: v(2), dtype: DType::F64 }).unwrap();
    gpu.execute(&Instr::Unary { dst: v(5), op: UnaryOp::Erf, src: v(4) }).unwrap();
}
