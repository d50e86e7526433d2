//! GPU benchmarks of the CUDA backend (needs a GPU; `cargo bench --features cuda --bench cuda`,
//! `GT_BENCH_QUICK=1` for small sizes, `GT_BENCH_SAVE=1` writes `bench/results/cuda-<device>.txt`).
//! PyTorch runs the same workloads in the same run (`bench/cuda_torch.py`) when installed.
//!
//! - an 8-op elementwise chain as one fused kernel (built by hand in the kernel IR, as the fuse
//!   pass will build it) against a device-to-device copy of the same bytes: effective bandwidth;
//!   the same chain unfused (8 instructions) for reference;
//! - row softmax as five instructions (max, sub, exp, sum, div), and as one hand-fused row
//!   kernel (what the fuse pass will produce);
//! - the chain again over bf16 buffers (computed in f32), against a copy of the bf16 bytes;
//! - matmul 4096^3 in TFLOP/s, f32 (FMA tiles), TF32 (tensor cores, `GT_MATMUL_PRECISION=high`),
//!   bf16 and f16 (tensor cores: `wgmma` on an H100, `mma.sync m16n8k16` elsewhere and with
//!   `GT_WGMMA=0`, both timed on an H100), each next to cuBLAS at the same precision, and
//!   `relu(x @ w + b)` with its epilogue fused;
//! - a 256 MB upload and read, through pinned chunks and from pageable memory;
//! - per-op overhead of tiny ops on the backend alone and through client -> dispatcher -> worker.
//!
//! Times are wall-clock around a stream synchronisation, medians of several repetitions.

use gt::frontend::{Client, ClientOptions, Origin};
use gt::ir::kernel::{samples, Access, Compute, Kernel, MapKernel, Node, Precision};
use gt::ir::{BinaryOp, DType, Instr, Operand, ReduceOp, TensorType, UnaryOp, ValueId};
use gt::runtime::backend::cuda::cache::KernelCache;
use gt::runtime::backend::cuda::ptx::Target;
use gt::runtime::backend::cuda::CudaBackend;
use gt::runtime::backend::{Backend, BackendKind};
use gt::runtime::{Cluster, ClusterOptions};
use std::fmt::Write as _;
use std::time::Instant;

fn v(i: u32) -> ValueId {
    ValueId(i)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Median milliseconds of `f` followed by a sync, after one warm-up.
fn time(g: &mut CudaBackend, reps: usize, mut f: impl FnMut(&mut CudaBackend)) -> f64 {
    f(g);
    g.finish().unwrap();
    let samples = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f(g);
            g.finish().unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(samples)
}

/// Effective bandwidth of reading and writing `n` f32 once in `ms`.
fn gbs_of(n: usize, ms: f64) -> f64 {
    (2 * n * 4) as f64 / (ms * 1e-3) / 1e9
}

fn exec(g: &mut CudaBackend, instr: Instr) {
    g.execute(&instr).unwrap_or_else(|e| panic!("{}: {e}", instr.mnemonic()));
}

fn chain_kernel(n: usize) -> Kernel {
    let c = Node::constant;
    Kernel::Map(MapKernel {
        shape: vec![n],
        inputs: vec![Access::contiguous(&[n])],
        nodes: vec![
            Node::Input(0),
            c(1.0001),
            Node::Binary(BinaryOp::Mul, 0, 1),
            c(0.5),
            Node::Binary(BinaryOp::Add, 2, 3),
            Node::Unary(UnaryOp::Tanh, 4),
            Node::Unary(UnaryOp::Exp, 5),
            Node::Binary(BinaryOp::Mul, 6, 3),
            c(0.25),
            Node::Binary(BinaryOp::Sub, 7, 8),
            Node::Unary(UnaryOp::Abs, 9),
            Node::Unary(UnaryOp::Sqrt, 10),
        ],
        output: Access::contiguous(&[n]),
        rows: vec![],
        reduce: None,
        compute: Compute::F32,
    })
}

fn torch(quick: bool) -> Option<serde_json_lite::Object> {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/cuda_torch.py"));
    if quick {
        cmd.arg("quick");
    }
    let out = cmd.output().ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json_lite::parse(&String::from_utf8_lossy(&out.stdout))
}

/// Enough JSON for the flat object the torch script prints.
mod serde_json_lite {
    /// Keys and their raw values (numbers or strings).
    pub type Object = Vec<(String, String)>;

    pub fn parse(text: &str) -> Option<Object> {
        let body = text.trim().strip_prefix('{')?.strip_suffix('}')?;
        let mut out = Vec::new();
        for part in body.split(", \"") {
            let (k, v) = part.split_once("\": ")?;
            out.push((k.trim_matches('"').to_string(), v.trim_matches('"').to_string()));
        }
        Some(out)
    }

    pub fn number(o: &Object, key: &str) -> Option<f64> {
        o.iter().find(|(k, _)| k == key)?.1.parse().ok()
    }

    pub fn text<'a>(o: &'a Object, key: &str) -> Option<&'a str> {
        o.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn main() {
    let quick = std::env::var_os("GT_BENCH_QUICK").is_some();
    let reps = if quick { 3 } else { 10 };
    let mut g = match CudaBackend::new(0, usize::MAX) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("no GPU: {e}");
            return;
        }
    };
    let mut report = String::new();
    let device = g.device_name().to_string();
    let _ = writeln!(report, "# gt CUDA backend on {device}{}", if quick { " (quick sizes)" } else { "" });
    let t = torch(quick);
    match &t {
        Some(t) => {
            let _ = writeln!(
                report,
                "# PyTorch {} on {}",
                serde_json_lite::text(t, "torch").unwrap_or("?"),
                serde_json_lite::text(t, "device").unwrap_or("?")
            );
        }
        None => {
            let _ = writeln!(report, "# PyTorch: not available (skipped)");
        }
    }
    let tnum = |k: &str| t.as_ref().and_then(|t| serde_json_lite::number(t, k));

    // 1. Elementwise chain vs copy.
    let n: usize = if quick { 1 << 24 } else { 1 << 28 };
    exec(&mut g, Instr::Rand { dst: v(0), ty: TensorType::f32(vec![n]), seed: 1 });
    let kernel = chain_kernel(n);
    let fused = time(&mut g, reps, |g| g.run_kernel(&kernel, &[v(0)], v(1), TensorType::f32(vec![n])).unwrap());
    let copy = time(&mut g, reps, |g| g.copy(v(0), v(2)).unwrap());
    exec(&mut g, Instr::Free { src: v(1) });
    exec(&mut g, Instr::Free { src: v(2) });
    let unfused = time(&mut g, reps.min(5), |g| {
        let steps: [(u32, Instr); 8] = [
            (
                10,
                Instr::Binary {
                    dst: v(10),
                    op: BinaryOp::Mul,
                    lhs: Operand::Value(v(0)),
                    rhs: Operand::Scalar(1.0001),
                },
            ),
            (
                11,
                Instr::Binary { dst: v(11), op: BinaryOp::Add, lhs: Operand::Value(v(10)), rhs: Operand::Scalar(0.5) },
            ),
            (12, Instr::Unary { dst: v(12), op: UnaryOp::Tanh, src: v(11) }),
            (13, Instr::Unary { dst: v(13), op: UnaryOp::Exp, src: v(12) }),
            (
                14,
                Instr::Binary { dst: v(14), op: BinaryOp::Mul, lhs: Operand::Value(v(13)), rhs: Operand::Scalar(0.5) },
            ),
            (
                15,
                Instr::Binary { dst: v(15), op: BinaryOp::Sub, lhs: Operand::Value(v(14)), rhs: Operand::Scalar(0.25) },
            ),
            (16, Instr::Unary { dst: v(16), op: UnaryOp::Abs, src: v(15) }),
            (17, Instr::Unary { dst: v(17), op: UnaryOp::Sqrt, src: v(16) }),
        ];
        for (i, (dst, instr)) in steps.into_iter().enumerate() {
            exec(g, instr);
            if i > 0 {
                exec(g, Instr::Free { src: v(dst - 1) });
            }
        }
        exec(g, Instr::Free { src: v(17) });
    });
    exec(&mut g, Instr::Free { src: v(0) });
    let gbs = |ms: f64| gbs_of(n, ms);
    // Transpose of an 8192x8192 (or 2048^2) matrix through the instruction.
    let side = if quick { 2048 } else { 8192 };
    exec(&mut g, Instr::Rand { dst: v(3), ty: TensorType::f32(vec![side, side]), seed: 2 });
    let transpose = time(&mut g, reps, |g| exec(g, Instr::Transpose { dst: v(4), src: v(3), dim0: 0, dim1: 1 }));
    let square_copy = time(&mut g, reps, |g| g.copy(v(3), v(5)).unwrap());
    for i in 3..=5 {
        exec(&mut g, Instr::Free { src: v(i) });
    }
    let _ = writeln!(report, "\n## 8-op elementwise chain on {n} f32 (read + write {} MiB)", (2 * n * 4) >> 20);
    let _ = writeln!(report, "fused kernel     {fused:9.3} ms  {:7.1} GB/s", gbs(fused));
    let _ = writeln!(report, "device copy      {copy:9.3} ms  {:7.1} GB/s", gbs(copy));
    let _ = writeln!(report, "fused / copy bandwidth: {:.1}% (goal >= 85%)", 100.0 * copy / fused);
    let _ = writeln!(report, "unfused (8 ops)  {unfused:9.3} ms  ({:.2}x the fused time)", unfused / fused);
    if let Some(tc) = tnum("chain_ms") {
        let _ = writeln!(report, "PyTorch chain    {tc:9.3} ms  -> gt fused is {:.2}x faster", tc / fused);
    }
    if let Some(tc) = tnum("copy_ms") {
        let _ = writeln!(report, "PyTorch clone    {tc:9.3} ms");
    }

    // The same chain over bf16 buffers (half the bytes; computed in f32).
    exec(&mut g, Instr::Rand { dst: v(0), ty: TensorType::f32(vec![n]), seed: 1 });
    exec(&mut g, Instr::Cast { dst: v(8), src: v(0), dtype: DType::BF16 });
    exec(&mut g, Instr::Free { src: v(0) });
    let bf = TensorType::new(DType::BF16, vec![n]);
    let fused_bf16 = time(&mut g, reps, |g| g.run_kernel(&kernel, &[v(8)], v(9), bf.clone()).unwrap());
    let copy_bf16 = time(&mut g, reps, |g| g.copy(v(8), v(2)).unwrap());
    for i in [2, 8, 9] {
        exec(&mut g, Instr::Free { src: v(i) });
    }
    let _ = writeln!(report, "\n## 8-op elementwise chain on {n} bf16 (read + write {} MiB)", (2 * n * 2) >> 20);
    let _ = writeln!(report, "fused kernel     {fused_bf16:9.3} ms  {:7.1} GB/s", gbs(fused_bf16) / 2.0);
    let _ = writeln!(report, "device copy      {copy_bf16:9.3} ms  {:7.1} GB/s", gbs(copy_bf16) / 2.0);
    let _ = writeln!(report, "fused / copy bandwidth: {:.1}% (goal >= 90%)", 100.0 * copy_bf16 / fused_bf16);
    if let Some(tc) = tnum("chain_bf16_ms") {
        let _ = writeln!(report, "PyTorch chain    {tc:9.3} ms  -> gt fused is {:.2}x faster", tc / fused_bf16);
    }

    // A full sum of the 256M elements (two passes over many blocks).
    exec(&mut g, Instr::Rand { dst: v(6), ty: TensorType::f32(vec![n]), seed: 7 });
    let total = time(&mut g, reps, |g| {
        exec(g, Instr::Reduce { dst: v(7), op: ReduceOp::Sum, src: v(6), axes: None, keepdim: false })
    });
    exec(&mut g, Instr::Free { src: v(6) });
    exec(&mut g, Instr::Free { src: v(7) });
    let _ = writeln!(
        report,
        "\n## sum of {n} f32\ntwo-pass reduction {total:9.3} ms  {:7.1} GB/s read",
        (n * 4) as f64 / (total * 1e-3) / 1e9
    );
    let _ = writeln!(report, "\n## transpose {side}x{side}");
    let _ = writeln!(
        report,
        "tiled transpose  {transpose:9.3} ms  {:7.1} GB/s ({:.0}% of a copy of the same bytes)",
        gbs_of(side * side, transpose),
        100.0 * square_copy / transpose
    );

    // 2. Row softmax, as five instructions.
    let rows: usize = if quick { 4096 } else { 16384 };
    exec(&mut g, Instr::Randn { dst: v(20), ty: TensorType::f32(vec![rows, rows]), seed: 3 });
    let softmax = time(&mut g, reps, |g| {
        let ax = Some(vec![1]);
        exec(g, Instr::Reduce { dst: v(21), op: ReduceOp::Max, src: v(20), axes: ax.clone(), keepdim: true });
        exec(
            g,
            Instr::Binary { dst: v(22), op: BinaryOp::Sub, lhs: Operand::Value(v(20)), rhs: Operand::Value(v(21)) },
        );
        exec(g, Instr::Unary { dst: v(23), op: UnaryOp::Exp, src: v(22) });
        exec(g, Instr::Reduce { dst: v(24), op: ReduceOp::Sum, src: v(23), axes: ax, keepdim: true });
        exec(
            g,
            Instr::Binary { dst: v(25), op: BinaryOp::Div, lhs: Operand::Value(v(23)), rhs: Operand::Value(v(24)) },
        );
        for i in 21..=25 {
            exec(g, Instr::Free { src: v(i) });
        }
    });
    let fused_softmax = samples::softmax(&[rows, rows]);
    let ty = TensorType::f32(vec![rows, rows]);
    let one_kernel = time(&mut g, reps, |g| g.run_kernel(&fused_softmax, &[v(20)], v(26), ty.clone()).unwrap());
    exec(&mut g, Instr::Free { src: v(26) });
    exec(&mut g, Instr::Free { src: v(20) });

    let _ = writeln!(report, "\n## row softmax {rows}x{rows}");
    let _ = writeln!(report, "gt, 5 instructions (unfused)    {softmax:9.3} ms");
    let _ = writeln!(
        report,
        "gt, one row kernel (hand-fused) {one_kernel:9.3} ms  {:7.1} GB/s",
        gbs_of(rows * rows, one_kernel)
    );
    if let Some(ts) = tnum("softmax_ms") {
        let (fused, unfused) = (ts / one_kernel, ts / softmax);
        let _ = writeln!(
            report,
            "PyTorch                         {ts:9.3} ms  -> gt/PyTorch speed: fused {fused:.2}x (goal >= 1.0x), unfused {unfused:.2}x"
        );
    }

    // 3. Matmul.
    let size: usize = if quick { 1024 } else { 4096 };
    exec(&mut g, Instr::Randn { dst: v(30), ty: TensorType::f32(vec![size, size]), seed: 4 });
    exec(&mut g, Instr::Randn { dst: v(31), ty: TensorType::f32(vec![size, size]), seed: 5 });
    let mm = time(&mut g, reps, |g| {
        exec(g, Instr::MatMul { dst: v(32), lhs: v(30), rhs: v(31) });
    });
    let tflops = |ms: f64| 2.0 * (size as f64).powi(3) / (ms * 1e-3) / 1e12;
    // TF32 the way a user gets it (GT_MATMUL_PRECISION=high): the same instruction.
    g.set_matmul_precision(Precision::Tf32);
    let tf32 = time(&mut g, reps, |g| {
        exec(g, Instr::MatMul { dst: v(38), lhs: v(30), rhs: v(31) });
    });
    g.set_matmul_precision(Precision::F32);
    let _ = writeln!(report, "\n## matmul {size}^3 f32");
    // gt's time (`label`), then cuBLAS's at the same precision (`blas`) and the ratio.
    let row = |report: &mut String, (label, ms): (&str, f64), (key, blas, short): (&str, &str, &str), goal: &str| {
        let _ = writeln!(report, "{:<16} {ms:9.3} ms  {:6.2} TFLOP/s", format!("gt ({label})"), tflops(ms));
        if let Some(t) = tnum(key) {
            let _ = writeln!(
                report,
                "cuBLAS {blas:<4}      {t:9.3} ms  {:6.2} TFLOP/s -> gt {short} at {:.0}%{goal}",
                tflops(t),
                100.0 * t / ms
            );
        }
    };
    row(&mut report, ("f32 FMA", mm), ("matmul_f32_ms", "f32", "f32 FMA"), "");
    let tf32_kind = if g.target() == Target::Sm90a { "TF32 wgmma" } else { "TF32 mma" };
    row(&mut report, (tf32_kind, tf32), ("matmul_tf32_ms", "tf32", tf32_kind), " (goal >= 70%)");
    // Half precision on tensor cores: the same operands cast to bf16 and f16.
    let hopper = g.target() == Target::Sm90a;
    let kind = if hopper { "wgmma" } else { "mma" };
    for (dtype, name, key) in [(DType::BF16, "bf16", "matmul_bf16_ms"), (DType::F16, "f16", "matmul_f16_ms")] {
        exec(&mut g, Instr::Cast { dst: v(50), src: v(30), dtype });
        exec(&mut g, Instr::Cast { dst: v(51), src: v(31), dtype });
        let ms = time(&mut g, reps, |g| exec(g, Instr::MatMul { dst: v(52), lhs: v(50), rhs: v(51) }));
        row(&mut report, (&format!("{name} {kind}"), ms), (key, name, name), " (goal >= 70%)");
        for i in 50..=52 {
            exec(&mut g, Instr::Free { src: v(i) });
        }
    }
    // A fresh backend's bf16 matmul of new operands, with the kernel chosen by `env` (a
    // kernel is generated once per backend).
    let bf16_matmul = |env: &[(&str, &str)]| {
        for (k, val) in env {
            std::env::set_var(k, val);
        }
        let bf = |shape: Vec<usize>| TensorType::new(DType::BF16, shape);
        let mut fresh = CudaBackend::new(0, usize::MAX).unwrap();
        exec(&mut fresh, Instr::Randn { dst: v(0), ty: bf(vec![size, size]), seed: 1 });
        exec(&mut fresh, Instr::Randn { dst: v(1), ty: bf(vec![size, size]), seed: 2 });
        let ms = time(&mut fresh, reps, |g| exec(g, Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) }));
        for (k, _) in env {
            std::env::remove_var(k);
        }
        ms
    };
    if hopper {
        let ms = bf16_matmul(&[("GT_WGMMA", "0")]);
        let _ = writeln!(report, "gt bf16, mma.sync (GT_WGMMA=0) {ms:9.3} ms  {:6.2} TFLOP/s", tflops(ms));
        // Other tilings of the wgmma kernel (`GT_WGMMA_TILES=BMxBNxSTAGES,...`).
        for tile in std::env::var("GT_WGMMA_TILES").unwrap_or_default().split(',').filter(|t| !t.is_empty()) {
            let ms = bf16_matmul(&[("GT_WGMMA_TILE", tile)]);
            let _ = writeln!(report, "gt bf16 wgmma, tile {tile:<12} {ms:9.3} ms  {:6.2} TFLOP/s", tflops(ms));
        }
    }
    // Other tilings of the mma.sync kernel (`GT_MMA_TILES=BMxBNxWMxWNxSTAGES,...`).
    for tile in std::env::var("GT_MMA_TILES").unwrap_or_default().split(',').filter(|t| !t.is_empty()) {
        let ms = bf16_matmul(&[("GT_MMA_TILE", tile), ("GT_WGMMA", "0")]);
        let _ = writeln!(report, "gt bf16 mma.sync, tile {tile:<18} {ms:9.3} ms  {:6.2} TFLOP/s", tflops(ms));
    }
    // A fresh process's first bf16 matmul: its kernels compiled by the driver, or loaded
    // from gt's disk cache (the driver's own cache is off for this bench: CUDA_CACHE_DISABLE).
    let dir = std::env::temp_dir().join(format!("gt-bench-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first_run = |cache: KernelCache| {
        let mut fresh = CudaBackend::new(0, usize::MAX).unwrap();
        fresh.set_kernel_cache(cache);
        let t = Instant::now();
        exec(&mut fresh, Instr::Randn { dst: v(0), ty: TensorType::new(DType::BF16, vec![size, size]), seed: 1 });
        exec(&mut fresh, Instr::MatMul { dst: v(1), lhs: v(0), rhs: v(0) });
        fresh.finish().unwrap();
        (t.elapsed().as_secs_f64() * 1e3, fresh.counters())
    };
    let (cold, _) = first_run(KernelCache::off());
    let _ = first_run(KernelCache::at(&dir));
    let (warm, counters) = first_run(KernelCache::at(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = writeln!(
        report,
        "first randn + bf16 matmul of a fresh backend: {cold:7.1} ms compiling, {warm:7.1} ms with the disk cache \
         ({} of {} kernels from disk)",
        counters.disk_hits, counters.compiles
    );
    // relu(x @ w + b): three instructions, or one matmul with its epilogue.
    exec(&mut g, Instr::Randn { dst: v(33), ty: TensorType::f32(vec![size]), seed: 6 });
    let unfused = time(&mut g, reps, |g| {
        exec(g, Instr::MatMul { dst: v(34), lhs: v(30), rhs: v(31) });
        exec(
            g,
            Instr::Binary { dst: v(35), op: BinaryOp::Add, lhs: Operand::Value(v(34)), rhs: Operand::Value(v(33)) },
        );
        exec(g, Instr::Unary { dst: v(36), op: UnaryOp::Relu, src: v(35) });
    });
    let linear = samples::linear_relu(size, size, size);
    let sq = TensorType::f32(vec![size, size]);
    let fused = time(&mut g, reps, |g| g.run_kernel(&linear, &[v(30), v(31), v(33)], v(37), sq.clone()).unwrap());
    let _ =
        writeln!(report, "relu(x @ w + b), 3 instructions {unfused:9.3} ms; one matmul with epilogue {fused:9.3} ms");
    for i in 30..=38 {
        exec(&mut g, Instr::Free { src: v(i) });
    }

    // 4. Host <-> device: a 256 MB f32 value uploaded (a literal) and read, through pinned
    // chunks (the default) and from pageable memory (`GT_PINNED=0`).
    let n = if quick { 1 << 22 } else { 1 << 26 };
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let literal = Instr::Literal { dst: v(60), ty: TensorType::f32(vec![n]), data: gt::ir::data::Elements::F32(host) };
    let _ = writeln!(report, "\n## upload and read of {} MB (f32)", (n * 4) >> 20);
    for pinned in [true, false] {
        g.set_pinned(pinned);
        let up = time(&mut g, reps, |g| g.execute(&literal).unwrap());
        let down = time(&mut g, reps, |g| {
            g.read(v(60)).unwrap();
        });
        let label = if pinned { "pinned chunks" } else { "pageable     " };
        let _ = writeln!(
            report,
            "{label}  upload {up:8.2} ms {:6.1} GB/s   read {down:8.2} ms {:6.1} GB/s",
            gbs_of(n, up) / 2.0,
            gbs_of(n, down) / 2.0
        );
    }
    g.set_pinned(true);
    exec(&mut g, Instr::Free { src: v(60) });
    // For scale: writing the same bytes into fresh host memory (first touch, page faults).
    let touch = median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(vec![1u8; n * 4]);
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    );
    let _ = writeln!(report, "first touch of {} MB of fresh host memory: {touch:8.2} ms", (n * 4) >> 20);

    // 5. Tiny ops: the backend alone, then through the whole runtime.
    let ops = if quick { 2_000 } else { 20_000 };
    exec(&mut g, Instr::Ones { dst: v(40), ty: TensorType::f32(vec![4]) });
    let backend_ms = time(&mut g, 3, |g| {
        for _ in 0..ops {
            exec(
                g,
                Instr::Binary { dst: v(41), op: BinaryOp::Add, lhs: Operand::Value(v(40)), rhs: Operand::Scalar(1.0) },
            );
        }
    });
    drop(g);
    let mut options = ClusterOptions::embedded(1);
    options.backend = BackendKind::Cuda;
    let cluster = Cluster::start(options).unwrap();
    let mut client = Client::connect_in(cluster.context(), cluster.endpoint(), ClientOptions::default()).unwrap();
    let origin = Origin { op: "add", span: None };
    client.submit(Instr::Ones { dst: v(0), ty: TensorType::f32(vec![4]) }, origin).unwrap();
    client.sync().unwrap();
    let mut samples = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..ops {
            let add =
                Instr::Binary { dst: v(1), op: BinaryOp::Add, lhs: Operand::Value(v(0)), rhs: Operand::Scalar(1.0) };
            client.submit(add, origin).unwrap();
        }
        client.sync().unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let runtime_ms = median(samples);
    drop(client);
    drop(cluster);
    let _ = writeln!(report, "\n## per-op overhead, {ops} tiny adds (f32[4])");
    let _ = writeln!(report, "backend alone              {:6.2} us/op", backend_ms * 1e3 / ops as f64);
    let _ = writeln!(report, "client->dispatcher->worker {:6.2} us/op (goal <= 10 us)", runtime_ms * 1e3 / ops as f64);

    print!("{report}");
    if std::env::var_os("GT_BENCH_SAVE").is_some() {
        let name: String =
            device.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
        let dir = std::env::var("GT_BENCH_OUT")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results").into());
        let path = format!("{dir}/cuda-{name}.txt");
        std::fs::write(&path, &report).unwrap();
        eprintln!("wrote {path}");
    }
}
