//! Pass-pipeline overhead: time per instruction through the dispatcher's pipeline with no
//! pass, the runtime's default passes (shard, fuse on compile signals, dead) and every pass on
//! (fuse compiling every region), on a 1,000,000-instruction stream, and hot-path detection's time per
//! instruction at 10^4, 10^5 and 10^6 instructions (it must stay flat: linear in the stream),
//! what `GT_AUTO_COMPILE=1`'s pipeline adds to the defaults (a loop of tiny ops, the training
//! loop; given one instruction at a time, and a batch at a time as the dispatcher gives them),
//! and the fuse pass's time per region.
//! Run: `cargo bench --bench passes` (`GT_BENCH_QUICK=1`: 10^5 at most; `GT_BENCH_SAVE=1`
//! writes `bench/results/passes-HOST.txt`).

use gt::ir::{BinaryOp, Instr, Operand, ReduceOp, TensorType, UnaryOp, ValueId};
use gt::passes::{registry, Emit, Fuse, FuseConfig, PassOptions, Pipeline, StreamPass, KNOWN_PASSES};
use gt_runtime::backend::cpu::jit::Jit;
use gt_runtime::config::EnvConfig;
use std::fmt::Write as _;
use std::time::Instant;

/// A training-loop-like stream (12-instruction steps with fresh ids, weights redefined each
/// step), or with `noise`, a stream where one instruction in 7 is a random other op, so
/// repetitions keep breaking off (the detector's harder case).
fn stream(n: usize, noise: bool) -> Vec<Instr> {
    let v = ValueId;
    let (mut id, mut w1, mut w2) = (10u32, v(2), v(3));
    let mut out = Vec::with_capacity(n);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    while out.len() < n {
        let mut next = || {
            id = id.wrapping_add(1).max(10);
            v(id)
        };
        let (h, a, y, d, l, g2, dh, g1, nw1, nw2) =
            (next(), next(), next(), next(), next(), next(), next(), next(), next(), next());
        let step = [
            Instr::MatMul { dst: h, lhs: v(0), rhs: w1 },
            Instr::Unary { op: UnaryOp::Relu, dst: a, src: h },
            Instr::MatMul { dst: y, lhs: a, rhs: w2 },
            Instr::Binary { op: BinaryOp::Sub, dst: d, lhs: Operand::Value(y), rhs: Operand::Value(v(1)) },
            Instr::Reduce { op: ReduceOp::Mean, dst: l, src: d, axes: None, keepdim: false },
            Instr::MatMul { dst: g2, lhs: a, rhs: d },
            Instr::MatMul { dst: dh, lhs: d, rhs: w2 },
            Instr::MatMul { dst: g1, lhs: v(0), rhs: dh },
            Instr::Binary { op: BinaryOp::Sub, dst: nw1, lhs: Operand::Value(w1), rhs: Operand::Value(g1) },
            Instr::Binary { op: BinaryOp::Sub, dst: nw2, lhs: Operand::Value(w2), rhs: Operand::Value(g2) },
            Instr::Free { src: w1 },
            Instr::Free { src: w2 },
        ];
        (w1, w2) = (nw1, nw2);
        for i in step {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if noise && rng.is_multiple_of(7) {
                let op = [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Neg][(rng >> 8) as usize % 3];
                out.push(Instr::Unary { op, dst: v(5), src: v(0) });
            }
            out.push(i);
        }
    }
    out.truncate(n);
    out
}

/// Nanoseconds per instruction through `pipeline` (median of `reps`), flushing every 1,000
/// instructions as sync points would.
fn ns_per_instr(make: &dyn Fn() -> Pipeline, input: &[Instr], reps: usize) -> f64 {
    ns_per_instr_by(make, input, reps, 1)
}

/// [`ns_per_instr`] with the instructions given `batch` at a time ([`Pipeline::run_many`],
/// as the dispatcher gives a client's batch, `SPARE_CAPACITY` at a time; 1: one by one).
fn ns_per_instr_by(make: &dyn Fn() -> Pipeline, input: &[Instr], reps: usize, batch: usize) -> f64 {
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let mut p = make();
            let mut out = Vec::with_capacity(1024);
            let data = input.to_vec();
            let t = Instant::now();
            let mut data = (0u64..).zip(data).peekable();
            while let Some(&(k, _)) = data.peek() {
                // Up to the next sync point, `batch` at a time.
                let n = batch.min(1000 - (k % 1000) as usize);
                p.run_many(data.by_ref().take(n).map(|(k, i)| (i, k)), &mut out);
                let last = k + n as u64 - 1;
                if last % 1000 == 999 {
                    p.flush(last, &mut out);
                }
                out.clear();
            }
            p.flush(input.len() as u64, &mut out);
            t.elapsed().as_nanos() as f64 / input.len() as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A loop of `neg` on one input, each result freed at once: `n` instructions.
fn tiny_ops(n: usize) -> Vec<Instr> {
    let x = ValueId(1);
    let mut out = vec![Instr::Randn { dst: x, ty: TensorType::new(gt::ir::DType::F32, vec![1]), seed: 1 }];
    for k in 0..(n as u32 - 1) / 2 {
        let dst = ValueId(10 + k);
        out.push(Instr::Unary { dst, op: UnaryOp::Neg, src: x });
        out.push(Instr::Free { src: dst });
    }
    out
}

/// The fuse pass's time per region (e-graph saturation and extraction plus partitioning):
/// a 200-instruction elementwise region, a softmax, and each example script as one region.
fn fuse_latency(report: &mut String, reps: usize) {
    let _ = writeln!(report, "\n4. fuse pass per region (e-graph + partitioner), median ms");
    // Median fuse time, the kernels made, and the median Cranelift compile time per kernel.
    let time = |stream: &[Instr]| -> (f64, u64, f64) {
        let mut times = Vec::new();
        let mut kernels = Vec::new();
        for _ in 0..reps {
            let mut pass = Fuse::new(FuseConfig::default());
            let mut out = Emit::new("fuse");
            let t = Instant::now();
            for i in stream {
                pass.run(i.clone(), &mut out);
            }
            pass.flush(&mut out);
            times.push(t.elapsed().as_secs_f64() * 1e3);
            kernels = out
                .into_items()
                .into_iter()
                .filter_map(|(i, _)| if let Instr::Fused { kernel, .. } = i { Some(*kernel) } else { None })
                .collect();
        }
        times.sort_by(f64::total_cmp);
        let mut compiles: Vec<f64> = kernels
            .iter()
            .map(|k| Jit::new().expect("a JIT for this host").compile(k).expect("compiles").as_secs_f64() * 1e3)
            .collect();
        compiles.sort_by(f64::total_cmp);
        let compile = compiles.get(compiles.len() / 2).copied().unwrap_or(0.0);
        (times[times.len() / 2], kernels.len() as u64, compile)
    };
    let v = ValueId;
    // 200 elementwise ops over two inputs, each reading the previous result; only the last
    // value lives on (the others are freed), as in a long fused expression.
    let mut chain = vec![
        Instr::Randn { dst: v(0), ty: TensorType::f32(vec![64, 64]), seed: 1 },
        Instr::Randn { dst: v(1), ty: TensorType::f32(vec![64]), seed: 2 },
    ];
    let ops = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub, BinaryOp::Maximum];
    for k in 0..200u32 {
        let (prev, dst) = (if k == 0 { v(0) } else { v(k + 1) }, v(k + 2));
        chain.push(if k % 3 == 2 {
            Instr::Unary { dst, op: [UnaryOp::Tanh, UnaryOp::Exp, UnaryOp::Neg][(k as usize / 3) % 3], src: prev }
        } else {
            let rhs = if k % 2 == 0 { Operand::Value(v(1)) } else { Operand::Scalar(0.5) };
            Instr::Binary { dst, op: ops[k as usize % 4], lhs: Operand::Value(prev), rhs }
        });
        if k > 0 {
            chain.push(Instr::Free { src: prev });
        }
    }
    let (ms, kernels, _) = time(&chain);
    let _ =
        writeln!(report, "{:<34} {ms:>8.2} ms  {kernels} kernel(s)  (goal <= 50 ms)", "200 elementwise instructions");
    let _ = writeln!(
        report,
        "examples, each one region: fuse time, kernels, and per kernel the e-graph share plus the median Cranelift \
         compile (goal <= 5 ms)"
    );
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files: Vec<_> = std::fs::read_dir(format!("{root}/examples"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "gtir"));
    files.sort();
    for path in files {
        let Ok(program) =
            std::fs::read_to_string(&path).map_err(|_| ()).and_then(|s| gt::ir::text::parse(&s).map_err(|_| ()))
        else {
            continue;
        };
        let stream: Vec<Instr> = program.instrs().into_iter().map(|(i, _)| i.clone()).collect();
        let (ms, kernels, compile) = time(&stream);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let per = if kernels > 0 { ms / kernels as f64 } else { ms };
        let _ = writeln!(
            report,
            "{name:<34} {ms:>8.2} ms  {kernels:>3} kernel(s): {per:.3} ms e-graph + {compile:.3} ms compile = {:.3} ms per kernel",
            per + compile
        );
    }
}

fn main() {
    let quick = std::env::var("GT_BENCH_QUICK").is_ok_and(|v| v == "1") || !std::env::args().any(|a| a == "--bench");
    let big = if quick { 100_000 } else { 1_000_000 };
    let reps = if quick { 3 } else { 5 };
    let options = PassOptions::default();
    let none = || Pipeline::new();
    let all = move || registry::pipeline(KNOWN_PASSES, &options).expect("known");
    let defaults = || registry::pipeline(registry::DEFAULT_PASSES, &registry::default_options()).expect("known");
    let mut report = String::new();
    let host =
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or("local".into());
    let _ = writeln!(
        report,
        "gt pass-pipeline benchmark: host {host}, median of {reps}; all on: {} (fuse compiling every region); \
         defaults: {} (fuse compiling compile signals only)",
        KNOWN_PASSES.join(", "),
        registry::DEFAULT_PASSES.join(", ")
    );
    let _ = writeln!(report, "\n1. overhead per instruction, {big} instructions (ns/instr)");
    let _ = writeln!(
        report,
        "{:<22} {:>10} {:>10} {:>10} {:>10}",
        "stream", "passes off", "defaults", "all on", "all added"
    );
    for (name, noise) in [("training loop", false), ("loop with noise 1/7", true)] {
        let input = stream(big, noise);
        let off = ns_per_instr(&none, &input, reps);
        let default = ns_per_instr(&defaults, &input, reps);
        let on = ns_per_instr(&all, &input, reps);
        let _ = writeln!(report, "{name:<22} {off:>10.1} {default:>10.1} {on:>10.1} {:>10.1}", on - off);
    }
    let _ = writeln!(report, "goal: <= 1000 ns added per instruction");
    let _ = writeln!(report, "\n2. hotpath alone, ns/instr by stream length (flat = linear)");
    let sizes: &[usize] = if quick { &[10_000, 100_000] } else { &[10_000, 100_000, 1_000_000] };
    let _ = writeln!(report, "{:<22} {}", "stream", sizes.iter().map(|n| format!("{n:>10}")).collect::<String>());
    let hotpath = move || registry::pipeline(&["hotpath"], &options).expect("known");
    for (name, noise) in [("training loop", false), ("loop with noise 1/7", true)] {
        let row: String =
            sizes.iter().map(|&n| format!("{:>10.1}", ns_per_instr(&hotpath, &stream(n, noise), reps))).collect();
        let _ = writeln!(report, "{name:<22} {row}");
    }
    // What GT_AUTO_COMPILE=1 adds to the defaults (the dispatcher's pipeline as config.rs
    // builds it), on a loop of tiny unrelated ops (a result dropped at once, as the vs_torch
    // tiny-op row issues them) and on the training loop.
    let _ = writeln!(report, "\n3. GT_AUTO_COMPILE=1's pipeline against the defaults, ns/instr, {big} instructions");
    let _ = writeln!(report, "{:<22} {:>10} {:>10} {:>10}", "stream", "defaults", "auto", "added");
    let auto_config = EnvConfig::from_lookup(|k| (k == "GT_AUTO_COMPILE").then(|| "1".to_string())).expect("valid");
    let auto = || registry::pipeline(&auto_config.passes, &auto_config.pass_options).expect("known");
    for (name, input) in [("tiny ops (neg, free)", tiny_ops(big)), ("training loop", stream(big, false))] {
        let (default, on) = (ns_per_instr(&defaults, &input, reps), ns_per_instr(&auto, &input, reps));
        let _ = writeln!(report, "{name:<22} {default:>10.1} {on:>10.1} {:>10.1}", on - default);
    }
    let batch = gt::passes::pipeline::SPARE_CAPACITY;
    let _ = writeln!(report, "the same, {batch} instructions at a time (as the dispatcher runs a client's batch)");
    for (name, input) in [("tiny ops (neg, free)", tiny_ops(big)), ("training loop", stream(big, false))] {
        let default = ns_per_instr_by(&defaults, &input, reps, batch);
        let on = ns_per_instr_by(&auto, &input, reps, batch);
        let _ = writeln!(report, "{name:<22} {default:>10.1} {on:>10.1} {:>10.1}", on - default);
    }
    fuse_latency(&mut report, reps);
    print!("{report}");
    if std::env::var("GT_BENCH_SAVE").is_ok_and(|v| v == "1") {
        let path = format!("{}/bench/results/passes-{host}.txt", env!("CARGO_MANIFEST_DIR"));
        std::fs::write(&path, &report).expect("bench/results is writable");
        println!("saved to {path}");
    }
}
