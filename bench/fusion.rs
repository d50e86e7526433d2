//! Kernel fusion on the CPU: an 8-op elementwise chain (with `tanh` and `exp`) over 2^24
//! f32 as one JIT-compiled kernel versus the interpreter running the 8 instructions one by
//! one; the fused kernel's bandwidth versus a STREAM triad compiled by rustc; the cost of
//! running a cached kernel beside its work (a 1-element and a 0-d `neg`); a row softmax
//! of 4096 x 4096 as one kernel versus its 5 unfused instructions; compile latency per
//! kernel; the chain over bf16 values, eager and fused; and PyTorch eager on one thread
//! (`bench/fusion_torch.py`) when installed. One thread throughout, medians of several runs.
//! Run: `cargo bench --bench fusion` (`GT_BENCH_QUICK=1`: 2^16 elements, 256 x 256;
//! `GT_BENCH_SAVE=1` writes `bench/results/fusion-vm.txt`).

/// gt's allocator, as its binaries and Python package run on (large buffers are reused, not
/// faulted in afresh by every op).
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

use gt_ir::kernel::{samples, Access, Compute, Kernel, MapKernel, Node};
use gt_ir::{BinaryOp, DType, Instr, Operand, ReduceOp, TensorType, UnaryOp, ValueId};
use gt_runtime::backend::cpu::jit::Jit;
use gt_runtime::Interpreter;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Median wall time of `reps` runs of `f`, after one warm-up run.
fn median(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A map over `[n]` reading `x` (input 0) and `y` (input 1) contiguously.
fn two_input_map(n: usize, nodes: Vec<Node>) -> Kernel {
    Kernel::Map(MapKernel {
        shape: vec![n],
        inputs: vec![Access::contiguous(&[n]); 2],
        nodes,
        output: Access::contiguous(&[n]),
        rows: vec![],
        reduce: None,
        compute: Compute::F32,
    })
}

/// The chain `relu(exp(tanh(x * 0.5 + 1) * y) - x) + y`: mul, add, tanh, mul, exp, sub, relu,
/// add, as one kernel over inputs `x`, `y`.
fn chain_kernel(n: usize) -> Kernel {
    use Node::*;
    two_input_map(
        n,
        vec![
            Input(0),
            Node::constant(0.5),
            Binary(BinaryOp::Mul, 0, 1),
            Node::constant(1.0),
            Binary(BinaryOp::Add, 2, 3),
            Unary(UnaryOp::Tanh, 4),
            Input(1),
            Binary(BinaryOp::Mul, 5, 6),
            Unary(UnaryOp::Exp, 7),
            Binary(BinaryOp::Sub, 8, 0),
            Unary(UnaryOp::Relu, 9),
            Binary(BinaryOp::Add, 10, 6),
        ],
    )
}

/// The same chain as 8 instructions on values 0 (`x`) and 1 (`y`); the result is value 10.
fn chain_instrs() -> Vec<Instr> {
    let v = ValueId;
    let val = |i: u32| Operand::Value(v(i));
    let bin = |dst: u32, op: BinaryOp, a: u32, b: Operand| Instr::Binary { dst: v(dst), op, lhs: val(a), rhs: b };
    let un = |dst: u32, op: UnaryOp, src: u32| Instr::Unary { dst: v(dst), op, src: v(src) };
    vec![
        bin(3, BinaryOp::Mul, 0, Operand::Scalar(0.5)),
        bin(4, BinaryOp::Add, 3, Operand::Scalar(1.0)),
        un(5, UnaryOp::Tanh, 4),
        bin(6, BinaryOp::Mul, 5, val(1)),
        un(7, UnaryOp::Exp, 6),
        bin(8, BinaryOp::Sub, 7, val(0)),
        un(9, UnaryOp::Relu, 8),
        bin(10, BinaryOp::Add, 9, val(1)),
    ]
}

/// The unfused softmax over the last axis of value 0; the result is value 5.
fn softmax_instrs() -> Vec<Instr> {
    let v = ValueId;
    let red = |dst: u32, op: ReduceOp, src: u32| Instr::Reduce {
        dst: v(dst),
        op,
        src: v(src),
        axes: Some(vec![-1]),
        keepdim: true,
    };
    let bin = |dst: u32, op: BinaryOp, a: u32, b: u32| Instr::Binary {
        dst: v(dst),
        op,
        lhs: Operand::Value(v(a)),
        rhs: Operand::Value(v(b)),
    };
    vec![
        red(1, ReduceOp::Max, 0),
        bin(2, BinaryOp::Sub, 0, 1),
        Instr::Unary { dst: v(3), op: UnaryOp::Exp, src: v(2) },
        red(4, ReduceOp::Sum, 3),
        bin(5, BinaryOp::Div, 3, 4),
    ]
}

/// `relu(max(x * 0.5 + 1, y) * y - x) + y` with a `neg` and an `abs`: 8 ops, no
/// transcendental function, same inputs and output as [`chain_kernel`].
fn cheap_chain_kernel(n: usize) -> Kernel {
    use Node::*;
    two_input_map(
        n,
        vec![
            Input(0),
            Node::constant(0.5),
            Binary(BinaryOp::Mul, 0, 1),
            Node::constant(1.0),
            Binary(BinaryOp::Add, 2, 3),
            Input(1),
            Binary(BinaryOp::Maximum, 4, 5),
            Binary(BinaryOp::Mul, 6, 5),
            Binary(BinaryOp::Sub, 7, 0),
            Unary(UnaryOp::Relu, 8),
            Unary(UnaryOp::Neg, 9),
            Unary(UnaryOp::Abs, 10),
            Binary(BinaryOp::Add, 11, 5),
        ],
    )
}

/// `a[i] = b[i] + s * c[i]`, what rustc makes of the STREAM triad.
#[inline(never)]
fn triad(a: &mut [f32], b: &[f32], c: &[f32], s: f32) {
    for ((a, &b), &c) in a.iter_mut().zip(b).zip(c) {
        *a = b + s * c;
    }
}

/// [`cheap_chain_kernel`] as rustc compiles it (NaN-propagating `max` and `relu`, as the JIT's).
#[inline(never)]
fn cheap_rustc(out: &mut [f32], x: &[f32], y: &[f32]) {
    let nan_max = |a: f32, b: f32| if a.is_nan() || b.is_nan() { a + b } else { a.max(b) };
    for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
        let t = nan_max(x * 0.5 + 1.0, y) * y - x;
        let relu = if t < 0.0 { 0.0 } else { t };
        *o = (-relu).abs() + y;
    }
}

/// `w - s * g`, as rustc compiles it.
#[inline(never)]
fn sgd_rustc(out: &mut [f32], w: &[f32], g: &[f32], s: f32) {
    for ((o, &w), &g) in out.iter_mut().zip(w).zip(g) {
        *o = w - s * g;
    }
}

/// Largest `|a - b| / max(1, |b|)`.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| (x - y).abs() / y.abs().max(1.0)).fold(0.0, f32::max)
}

/// PyTorch's timings (`name -> ms`) or why there are none.
fn torch(quick: bool) -> Result<Vec<(String, f64)>, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/fusion_torch.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script);
    if quick {
        cmd.arg("quick");
    }
    let out = cmd.output().map_err(|e| format!("python3 not runnable: {e}"))?;
    if out.status.code() == Some(3) {
        return Err("torch is not installed (python3 -c 'import torch' fails)".into());
    }
    if !out.status.success() {
        return Err(format!("fusion_torch.py failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').and_then(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?))))
        .collect())
}

fn main() {
    let quick = std::env::var("GT_BENCH_QUICK").is_ok_and(|v| v == "1") || !std::env::args().any(|a| a == "--bench");
    let n: usize = if quick { 1 << 16 } else { 1 << 24 };
    let side: usize = if quick { 256 } else { 4096 };
    let reps = if quick { 3 } else { 7 };
    let mut report = String::new();
    let _ = writeln!(report, "gt fusion benchmark (CPU JIT, Cranelift, one thread): median of {reps} runs");

    // Inputs, made by the interpreter's own RNG.
    let mut it = Interpreter::new();
    let randn =
        |dst: u32, dims: Vec<usize>, seed: u64| Instr::Randn { dst: ValueId(dst), ty: TensorType::f32(dims), seed };
    it.execute(&randn(0, vec![n], 1)).expect("randn");
    it.execute(&randn(1, vec![n], 2)).expect("randn");
    let x = it.read(ValueId(0)).expect("x").to_f32();
    let y = it.read(ValueId(1)).expect("y").to_f32();

    // 1. The chain, fused versus one instruction at a time.
    let mut jit = Jit::new().expect("a Cranelift backend for this host");
    let chain = chain_kernel(n);
    let mut out = vec![0.0f32; n];
    let fused = median(reps, || {
        jit.run(&chain, &[&x, &y], &mut out).expect("chain runs");
    });
    // The same kernel compiled by Cranelift (the JIT runs it by tiles, `jit/tiles.rs`).
    let mut cranelift = Jit::new().expect("a Cranelift backend for this host").compiling_all();
    let mut out_c = vec![0.0f32; n];
    let compiled = median(reps, || {
        cranelift.run(&chain, &[&x, &y], &mut out_c).expect("chain runs");
    });
    let instrs = chain_instrs();
    let unfused = median(reps, || {
        for i in &instrs {
            it.execute(i).expect("interpreted");
        }
    });
    let want = it.read(ValueId(10)).expect("result").to_f32();
    let bytes = (3 * 4 * n) as f64;
    let _ = writeln!(report, "\n1. 8-op chain relu(exp(tanh(x*0.5+1)*y)-x)+y over {n} f32");
    let _ = writeln!(report, "{:<34} {:>10} {:>10}", "", "ms", "GB/s");
    for (name, t) in [
        ("interpreter, 8 instructions", unfused),
        ("JIT, one fused kernel (by tiles)", fused),
        ("the kernel compiled (Cranelift)", compiled),
    ] {
        let _ = writeln!(report, "{name:<34} {:>10.2} {:>10.2}", ms(t), bytes / t.as_secs_f64() / 1e9);
    }
    let _ = writeln!(
        report,
        "speedup {:.1}x (goal >= 5x); max relative difference {:.1e} (compiled: {:.1e})",
        unfused.as_secs_f64() / fused.as_secs_f64(),
        max_diff(&out, &want),
        max_diff(&out_c, &want)
    );

    // 2. Bandwidth against the STREAM triad (2 reads + 1 write per element, as the chain).
    let mut a = vec![0.0f32; n];
    let triad_t = median(reps, || triad(black_box(&mut a), black_box(&x), black_box(&y), black_box(3.0)));
    let triad_bw = bytes / triad_t.as_secs_f64() / 1e9;
    let fused_bw = bytes / fused.as_secs_f64() / 1e9;
    let _ = writeln!(report, "\n2. effective bandwidth (bytes read + written / time)");
    let _ = writeln!(report, "{:<34} {:>10.2} ms {:>8.2} GB/s", "STREAM triad (rustc)", ms(triad_t), triad_bw);
    let _ = writeln!(report, "{:<34} {:>10.2} ms {:>8.2} GB/s", "fused chain (JIT)", ms(fused), fused_bw);
    let _ = writeln!(
        report,
        "fused chain at {:.0}% of triad bandwidth (goal >= 30%, issue 16; the fusion issue asked 70%)",
        100.0 * fused_bw / triad_bw
    );
    // The same shape of kernel with cheap ops only: how close the JIT's loops come to memory
    // speed when arithmetic is not the bound (tanh and exp are ~100 vector instructions per
    // four elements with 128-bit SIMD).
    let cheap = cheap_chain_kernel(n);
    let cheap_t = median(reps, || {
        jit.run(&cheap, &[&x, &y], &mut out).expect("cheap chain runs");
    });
    let cheap_bw = bytes / cheap_t.as_secs_f64() / 1e9;
    // The same chain as rustc compiles it: how much of the gap to the triad is the eight
    // ops' own work on 128-bit vectors (rustc's default x86-64 target, as the triad's).
    let cheap_rustc_t = median(reps, || cheap_rustc(black_box(&mut a), black_box(&x), black_box(&y)));
    let cheap_rustc_bw = bytes / cheap_rustc_t.as_secs_f64() / 1e9;
    let _ = writeln!(report, "{:<34} {:>10.2} ms {:>8.2} GB/s", "8 cheap ops (JIT)", ms(cheap_t), cheap_bw);
    let _ =
        writeln!(report, "{:<34} {:>10.2} ms {:>8.2} GB/s", "8 cheap ops (rustc)", ms(cheap_rustc_t), cheap_rustc_bw);
    let _ = writeln!(
        report,
        "8-op chain without tanh/exp at {:.0}% of triad bandwidth (goal >= 85%; rustc's loop of it: {:.0}%); \
         max relative difference {:.1e}",
        100.0 * cheap_bw / triad_bw,
        100.0 * cheap_rustc_bw / triad_bw,
        max_diff(&out, &a)
    );
    // A cheap map whose buffers stay in the cache (an SGD update `w - 0.01 * g` of a 784x256
    // weight, 200704 elements; fewer when quick), where the loop's own work, not memory,
    // bounds it: the JIT against rustc's loop.
    let m = (784 * 256).min(n);
    let sgd = two_input_map(
        m,
        vec![
            Node::Input(0),
            Node::constant(0.01),
            Node::Input(1),
            Node::Binary(BinaryOp::Mul, 1, 2),
            Node::Binary(BinaryOp::Sub, 0, 3),
        ],
    );
    let (w, g) = (&x[..m], &y[..m]);
    let mut updated = vec![0.0f32; m];
    let cache_reps = 51 * reps;
    let sgd_t = median(cache_reps, || {
        jit.run(&sgd, &[w, g], &mut updated).expect("the update runs");
    });
    let mut want = vec![0.0f32; m];
    let rustc_t = median(cache_reps, || sgd_rustc(black_box(&mut want), black_box(w), black_box(g), black_box(0.01)));
    let _ = writeln!(
        report,
        "{:<34} {:>10.2} µs (rustc's loop {:.2} µs: {:.2}x); max relative difference {:.1e}",
        format!("w - 0.01 * g, {m} f32 (JIT)"),
        sgd_t.as_secs_f64() * 1e6,
        rustc_t.as_secs_f64() * 1e6,
        sgd_t.as_secs_f64() / rustc_t.as_secs_f64(),
        max_diff(&updated, &want)
    );

    // What running a cached kernel costs beside its work: a `neg` of one element and of a
    // 0-d value (the bounds check, the cache lookup by kernel value, the call).
    for (name, dims) in [("neg, 1 element", vec![1usize]), ("neg, 0-d", vec![])] {
        let k = Kernel::Map(MapKernel {
            shape: dims.clone(),
            inputs: vec![Access::contiguous(&dims)],
            nodes: vec![Node::Input(0), Node::Unary(UnaryOp::Neg, 0)],
            output: Access::contiguous(&dims),
            rows: vec![],
            reduce: None,
            compute: Compute::F32,
        });
        let (one, mut got) = ([2.0f32], [0.0f32]);
        let runs = 10_000;
        let t = median(reps, || {
            for _ in 0..runs {
                jit.run(black_box(&k), &[&one], &mut got).expect("neg runs");
            }
        });
        let _ = writeln!(
            report,
            "{:<34} {:>10.0} ns per run of the cached kernel",
            format!("{name} (JIT)"),
            t.as_secs_f64() * 1e9 / runs as f64
        );
    }

    // 3. Softmax over rows, one kernel versus five instructions.
    it.execute(&Instr::Free { src: ValueId(0) }).expect("free");
    it.execute(&randn(0, vec![side, side], 3)).expect("randn");
    let s = it.read(ValueId(0)).expect("s").to_f32();
    let softmax = samples::softmax(&[side, side]);
    let mut sout = vec![0.0f32; side * side];
    let fused_s = median(reps, || {
        jit.run(&softmax, &[&s], &mut sout).expect("softmax runs");
    });
    let sm = softmax_instrs();
    let unfused_s = median(reps, || {
        for i in &sm {
            it.execute(i).expect("interpreted");
        }
    });
    let want = it.read(ValueId(5)).expect("softmax").to_f32();
    let _ = writeln!(report, "\n3. softmax over the rows of {side} x {side}");
    let _ = writeln!(report, "{:<34} {:>10.2} ms", "interpreter, 5 instructions", ms(unfused_s));
    let _ = writeln!(report, "{:<34} {:>10.2} ms", "JIT, one row kernel", ms(fused_s));
    let _ = writeln!(
        report,
        "speedup {:.1}x (goal >= 3x); max relative difference {:.1e}",
        unfused_s.as_secs_f64() / fused_s.as_secs_f64(),
        max_diff(&sout, &want)
    );

    // 4. Compile latency: each kernel in a fresh JIT (nothing cached).
    let kernels: Vec<(&str, Kernel)> = vec![
        ("chain (8 ops, tanh, exp)", chain_kernel(n)),
        ("softmax", samples::softmax(&[side, side])),
        ("layer_norm", samples::layer_norm(&[side, side], 1e-5)),
        ("gelu", samples::gelu(&[side, side])),
        ("linear_relu (epilogue)", samples::linear_relu(64, 64, 64)),
    ];
    let _ = writeln!(report, "\n4. compile latency (fresh JIT per compile)");
    let mut all = Vec::new();
    for (name, k) in &kernels {
        let mut c: Vec<Duration> = (0..reps).map(|_| Jit::new().expect("jit").compile(k).expect("compiles")).collect();
        c.sort();
        all.push(c[c.len() / 2]);
        let _ = writeln!(report, "{name:<34} {:>10.2} ms", ms(c[c.len() / 2]));
    }
    all.sort();
    let _ = writeln!(report, "median over these kernels: {:.2} ms", ms(all[all.len() / 2]));

    // 5. The chain over bf16 values: eager, each op widens its operands to f32, computes
    // and rounds; fused, the kernel reads bf16 widened once, computes in f32, rounds once.
    let mut hb = Interpreter::new().with_jit();
    let bf16_of =
        |dst: u32, seed: u64| Instr::Randn { dst: ValueId(dst), ty: TensorType::new(DType::BF16, vec![n]), seed };
    hb.execute(&bf16_of(0, 1)).expect("randn");
    hb.execute(&bf16_of(1, 2)).expect("randn");
    let eager_bf16 = median(reps, || {
        for i in &instrs {
            hb.execute(i).expect("interpreted");
        }
    });
    let fused_instr = Instr::Fused {
        dst: ValueId(20),
        ty: TensorType::new(DType::BF16, vec![n]),
        srcs: vec![ValueId(0), ValueId(1)],
        kernel: Box::new(chain.clone()),
    };
    let fused_bf16 = median(reps, || hb.execute(&fused_instr).expect("fused"));
    let eager_out = hb.read(ValueId(10)).expect("eager").to_f32();
    let fused_out = hb.read(ValueId(20)).expect("fused").to_f32();
    let bf16_bytes = (3 * 2 * n) as f64;
    let _ = writeln!(report, "\n5. the same chain over {n} bf16 (computed in f32)");
    let _ = writeln!(report, "{:<34} {:>10} {:>10}", "", "ms", "GB/s");
    for (name, t) in [("interpreter, 8 instructions", eager_bf16), ("one fused kernel", fused_bf16)] {
        let _ = writeln!(report, "{name:<34} {:>10.2} {:>10.2}", ms(t), bf16_bytes / t.as_secs_f64() / 1e9);
    }
    let _ = writeln!(
        report,
        "speedup {:.1}x; max relative difference {:.1e} (eager rounds after each op, fused once)",
        eager_bf16.as_secs_f64() / fused_bf16.as_secs_f64(),
        max_diff(&eager_out, &fused_out)
    );

    // 7. An SGD update fused into the product it reads (`w - 0.01 * x^T @ d`, the MLP's
    // first layer), on one thread and on two (the product splits by rows, and so does its
    // epilogue), against the same three instructions eager on two.
    let (rows, inner, cols) = (784, 64, 256);
    let cycled = |v: &[f32], len: usize, from: usize| (0..len).map(|i| v[(from + i) % v.len()]).collect::<Vec<f32>>();
    let (xs, ds, ws) = (cycled(&x, inner * rows, 0), cycled(&y, inner * cols, 0), cycled(&x, rows * cols, 7));
    let sgd = Kernel::MatMul(gt_ir::kernel::MatMulKernel {
        batch: vec![],
        m: rows,
        n: cols,
        k: inner,
        // x is [inner, rows]: its transpose is read through swapped strides.
        lhs: Access { offset: 0, strides: vec![1, rows as i64] },
        rhs: Access::contiguous(&[inner, cols]),
        epilogue: vec![
            Node::Input(0),
            Node::Acc,
            Node::constant(0.01),
            Node::Binary(BinaryOp::Mul, 1, 2),
            Node::Binary(BinaryOp::Sub, 0, 3),
        ],
        epilogue_inputs: vec![Access::contiguous(&[rows, cols])],
        precision: Default::default(),
    });
    let mut sgd_out = vec![0.0f32; rows * cols];
    let mut threaded = |threads: usize| {
        gt_runtime::backend::cpu::threads::use_threads(threads, Duration::from_micros(200)).expect("threads");
        let mut j = Jit::new().expect("jit");
        median(reps * 20, || {
            j.run(&sgd, &[&xs, &ds, &ws], &mut sgd_out).expect("product runs");
        })
    };
    let (one, two) = (threaded(1), threaded(2));
    let mut eager = Interpreter::new().with_jit();
    let literal = |dst: u32, dims: Vec<usize>, v: &[f32]| Instr::Literal {
        dst: ValueId(dst),
        ty: TensorType::f32(dims),
        data: gt_ir::data::Elements::F32(v.to_vec()),
    };
    eager.execute(&literal(0, vec![inner, rows], &xs)).expect("x");
    eager.execute(&literal(1, vec![inner, cols], &ds)).expect("d");
    eager.execute(&literal(2, vec![rows, cols], &ws)).expect("w");
    let steps = [
        Instr::Transpose { dst: ValueId(3), src: ValueId(0), dim0: 0, dim1: 1 },
        Instr::MatMul { dst: ValueId(4), lhs: ValueId(3), rhs: ValueId(1) },
        Instr::Binary {
            dst: ValueId(5),
            op: BinaryOp::Mul,
            lhs: Operand::Value(ValueId(4)),
            rhs: Operand::Scalar(0.01),
        },
        Instr::Binary {
            dst: ValueId(6),
            op: BinaryOp::Sub,
            lhs: Operand::Value(ValueId(2)),
            rhs: Operand::Value(ValueId(5)),
        },
    ];
    let eager_two = median(reps * 20, || {
        for i in &steps {
            eager.execute(i).expect("interpreted");
        }
    });
    gt_runtime::backend::cpu::threads::use_threads(1, Duration::ZERO).expect("threads");
    let eager_out = eager.read(ValueId(6)).expect("updated").to_f32();
    let _ =
        writeln!(report, "\n7. SGD update fused into its product, w - 0.01 * x^T @ d, {rows}x{inner} @ {inner}x{cols}");
    let _ = writeln!(report, "{:<34} {:>10.1} µs", "fused kernel, one thread", one.as_secs_f64() * 1e6);
    let _ = writeln!(report, "{:<34} {:>10.1} µs", "fused kernel, two threads", two.as_secs_f64() * 1e6);
    let _ = writeln!(report, "{:<34} {:>10.1} µs", "eager, 4 instructions, two threads", eager_two.as_secs_f64() * 1e6);
    let _ = writeln!(report, "max relative difference {:.1e}", max_diff(&sgd_out, &eager_out));

    // 6. PyTorch eager, one thread.
    let _ = writeln!(report, "\n6. PyTorch eager CPU, torch.set_num_threads(1)");
    match torch(quick) {
        Ok(rows) => {
            for (name, t) in rows {
                let ours = match name.as_str() {
                    "chain" => ms(fused),
                    "chain_bf16" => ms(fused_bf16),
                    _ => ms(fused_s),
                };
                let _ = writeln!(
                    report,
                    "{:<34} {:>10.2} ms (gt JIT {:.2} ms: {:.1}x)",
                    format!("torch {name}"),
                    t,
                    ours,
                    t / ours
                );
            }
        }
        Err(why) => {
            let _ = writeln!(report, "skipped: {why}");
        }
    }
    print!("{report}");
    if std::env::var("GT_BENCH_SAVE").is_ok_and(|v| v == "1") {
        let path = format!("{}/bench/results/fusion-vm.txt", env!("CARGO_MANIFEST_DIR"));
        std::fs::write(&path, &report).expect("bench/results is writable");
        println!("saved to {path}");
    }
}
