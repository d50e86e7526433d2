//! The pass pipeline in a running cluster: every subset of the passes gives the numbers of
//! the interpreter; the dead-value pass keeps worker memory flat over long loops and lowers
//! its peak; failures of instructions a pass held back or compiled are reported against the
//! instruction that defined the failing value; a worker's failed redefinition leaks nothing;
//! a signal whose config says `compile: true` is compiled with no other setting.

use crate::cli::{code, gt_run_env, script, stderr, stdout};
use crate::cluster::run_filetests;
use gt::frontend::{Client, ClientError, ClientOptions, Origin};
use gt::ir::{BinaryOp, Instr, Operand, TensorType, UnaryOp, ValueId};
use gt::passes::{registry, PassOptions, KNOWN_PASSES};
use gt::runtime::{Cluster, ClusterOptions};
use gt::script::run_any;
use std::ffi::OsStr;
use std::sync::Arc;

fn origin(op: &'static str) -> Origin {
    Origin { op, span: None }
}

fn cluster_with(passes: &'static [&'static str], options: PassOptions) -> Cluster {
    let mut o = ClusterOptions::embedded(1);
    o.dispatcher.pipeline = Arc::new(move |_| registry::pipeline(passes, &options).unwrap());
    Cluster::start(o).unwrap()
}

fn client(c: &Cluster) -> Client {
    Client::connect_in(c.context(), c.endpoint(), ClientOptions::default()).unwrap()
}

#[test]
fn every_subset_of_the_passes_gives_the_interpreters_numbers() {
    // Client k of the cluster gets subset k (clients are numbered from 1 as they connect).
    let subsets: Vec<Vec<&'static str>> = (0..1u32 << KNOWN_PASSES.len())
        .map(|bits| KNOWN_PASSES.iter().enumerate().filter(|(i, _)| bits & (1 << i) != 0).map(|(_, p)| *p).collect())
        .collect();
    let n = subsets.len() as u64;
    let options = PassOptions::default();
    let mut o = ClusterOptions::embedded(1);
    let table = subsets.clone();
    o.dispatcher.pipeline =
        Arc::new(move |client| registry::pipeline(&table[((client - 1) % n) as usize], &options).unwrap());
    let cluster = Cluster::start(o).unwrap();
    let mut failures = Vec::new();
    for path in run_filetests() {
        let reference = gt::filetest::run_file(&path).unwrap();
        let source = std::fs::read_to_string(&path).unwrap();
        let expects_error = source.contains("; error:");
        for subset in &subsets {
            let mut client = Some(client(&cluster));
            let got = gt::filetest::run_file_on(&path, &mut |loaded, out| {
                run_any(loaded, client.take().expect("one run per file"), out, Default::default()).0
            });
            let fused = subset.contains(&"fuse");
            match got {
                Ok(text) if text == reference => {}
                // A failure inside a fused region is reported as the region's kernel.
                Err(e) if fused && expects_error && format!("{e:#}").contains("fused: ") => {}
                // A value that is never read is never computed once fused, so a result over
                // the size limit that the script drops unread is no longer an error.
                Err(e)
                    if fused
                        && source.contains("over the limit")
                        && format!("{e:#}").contains("run succeeded, but errors were expected") => {}
                Ok(_) => failures.push(format!("{} with {subset:?}: differs from the interpreter", path.display())),
                Err(e) => failures.push(format!("{} with {subset:?}: {e:#}", path.display())),
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// One training-loop-like step with fresh ids, whose temporaries the client frees only at
/// the end of the step (as a garbage-collected client, or a scope's end, would), then a
/// read of the step's result: `x -> exp -> neg -> mul -> sum`, accumulated into `acc`.
fn late_freeing_step(c: &mut Client, step: u32, acc: ValueId) -> ValueId {
    let base = 10 + step * 8;
    let v = |k: u32| ValueId(base + k);
    let unary = |op, dst, src| Instr::Unary { op, dst, src };
    let binary = |op, dst, lhs, rhs| Instr::Binary { op, dst, lhs: Operand::Value(lhs), rhs: Operand::Value(rhs) };
    let instrs = [
        Instr::Full { dst: v(0), ty: TensorType::f32(vec![256, 256]), value: 0.001 },
        unary(UnaryOp::Exp, v(1), v(0)),
        unary(UnaryOp::Neg, v(2), v(1)),
        binary(BinaryOp::Mul, v(3), v(2), v(0)),
        Instr::Reduce { dst: v(4), op: gt::ir::ReduceOp::Sum, src: v(3), axes: None, keepdim: false },
        binary(BinaryOp::Add, v(5), acc, v(4)),
    ];
    for i in instrs {
        c.submit(i, origin("step")).unwrap();
    }
    for k in [0, 1, 2, 3, 4] {
        c.submit(Instr::Free { src: v(k) }, origin("free")).unwrap();
    }
    c.submit(Instr::Free { src: acc }, origin("free")).unwrap();
    v(5)
}

/// Live and peak bytes on the one worker after `steps` steps, reading the sum every step.
fn memory_after(cluster: &Cluster, steps: u32) -> (u64, u64, f32) {
    let mut c = client(cluster);
    let mut acc = ValueId(0);
    c.submit(Instr::Zeros { dst: acc, ty: TensorType::f32(vec![]) }, origin("zeros")).unwrap();
    let mut last = 0.0;
    for step in 0..steps {
        acc = late_freeing_step(&mut c, step, acc);
        last = c.read(acc).unwrap().to_f32()[0];
    }
    let w = &c.worker_stats().unwrap()[0];
    (w.live_bytes, w.peak_bytes, last)
}

#[test]
fn the_dead_value_pass_keeps_memory_flat_and_lowers_the_peak() {
    // Memory after 1,000 loop iterations equals memory after 10 (fresh clusters, so each
    // peak is its own run's).
    let dead = |steps| memory_after(&cluster_with(&["dead"], PassOptions::default()), steps);
    let (live_10, peak_10, sum_10) = dead(10);
    let (live_1000, peak_1000, sum_1000) = dead(1000);
    assert_eq!((live_10, peak_10), (live_1000, peak_1000), "live and peak bytes after 10 and 1000 steps");
    assert_eq!(live_10, 4, "only the accumulator is live between steps");
    // Without the pass the step's temporaries all live until the client's frees.
    let (live_none, peak_none, sum_none) = memory_after(&cluster_with(&[], PassOptions::default()), 10);
    assert_eq!((live_none, sum_none), (live_10, sum_10));
    let one = 256 * 256 * 4;
    // (The new acc is written over the old one, which dies with the add: the worker's in-place
    // ops.)
    assert_eq!(peak_none, 4 * one + 2 * 4, "x, exp, neg and mul at once, with acc and the sum");
    assert_eq!(
        peak_10,
        2 * one + 4,
        "the frees right after their last reads: neg writes over exp and mul over neg, so x and one more at once, \
         with acc"
    );
    assert!((sum_1000 / sum_10 - 100.0).abs() < 0.01, "{sum_1000} vs {sum_10}");
}

#[test]
fn a_failure_held_back_by_a_pass_is_reported_against_its_instruction() {
    let cluster = cluster_with(registry::DEFAULT_PASSES, registry::default_options());
    let mut a = client(&cluster);
    let full = |dst, n| Instr::Full { dst: ValueId(dst), ty: TensorType::f32(vec![n]), value: 1.0 };
    let add = |dst, lhs, rhs| Instr::Binary {
        op: BinaryOp::Add,
        dst: ValueId(dst),
        lhs: Operand::Value(ValueId(lhs)),
        rhs: Operand::Value(ValueId(rhs)),
    };
    a.submit(full(0, 2), origin("full")).unwrap();
    a.submit(full(1, 3), origin("full")).unwrap();
    a.submit(add(2, 0, 1), origin("add")).unwrap(); // seq 2: shapes do not broadcast
    a.submit(add(3, 0, 0), origin("add")).unwrap();
    a.submit(Instr::Free { src: ValueId(1) }, origin("free")).unwrap();
    // A free of a value never defined: the dead pass moves it to the region's start, so its
    // failure arrives first; the client still reports the earliest instruction's.
    a.submit(Instr::Free { src: ValueId(9) }, origin("free")).unwrap();
    let e = a.read(ValueId(3)).unwrap_err();
    match &e {
        ClientError::Op { seq, origin, failure, later } => {
            let message = &failure.message;
            assert_eq!((*seq, origin.op, *later), (2, "add", 1));
            assert!(message.contains("cannot broadcast [2] with [3]"), "{message}");
        }
        other => panic!("expected an op failure, got {other}"),
    }
    assert_eq!(a.read(ValueId(3)).unwrap().to_f32(), vec![2.0, 2.0]);
}

#[test]
fn a_redefinition_the_worker_fails_does_not_leak_the_value_it_was_to_replace() {
    let cluster = cluster_with(&[], PassOptions::default());
    let mut a = client(&cluster);
    let full = |dims: Vec<usize>| Instr::Full { dst: ValueId(1), ty: TensorType::f32(dims), value: 1.0 };
    a.submit(full(vec![2]), origin("full")).unwrap();
    // Verifies, but is over the worker's 8 GiB limit; it reuses %1's buffer.
    a.submit(full(vec![65536, 32769]), origin("full")).unwrap();
    let e = a.sync().unwrap_err();
    assert!(e.to_string().contains("over the limit"), "{e}");
    a.submit(Instr::Free { src: ValueId(1) }, origin("free")).unwrap();
    let w = &a.worker_stats().unwrap()[0];
    assert_eq!((w.live_values, w.live_bytes), (0, 0), "the old %1 is freed too");
}

const COMPILE_CONFIG: &str = "block:\n  compile: true\nother:\n  compile: false\n";

/// `softmax(x) * 2` inside signal `name` through the Tensor API.
fn softmax_in(name: &str) -> Vec<f32> {
    let x = gt::from_vec((0..12).map(|i| i as f32 * 0.25).collect(), &[3, 4]).unwrap();
    let _s = gt::signal::context(name).unwrap();
    gt::nn::softmax(&x, -1).unwrap().mul(2.0).unwrap().to_vec().unwrap()
}

#[test]
fn a_compile_signal_is_compiled_with_no_other_setting() {
    gt::signal::set_config(gt::config::Config::parse(COMPILE_CONFIG, "test.yaml").unwrap());
    let reference = {
        let _rt = gt::Runtime::reference();
        softmax_in("block")
    };
    // The runtime's default passes: fuse (compile signals only) and dead.
    let cluster = cluster_with(registry::DEFAULT_PASSES, registry::default_options());
    let kernels = |c: &mut Client| -> u64 {
        let (_, passes) = c.stats().unwrap();
        let fuse = passes.iter().find(|p| p.pass == "fuse").expect("fuse runs");
        fuse.counters.iter().find(|(k, _)| k == "kernels").unwrap().1
    };
    let ctx = gt::frontend::tensor::Context::new(client(&cluster));
    let guard = ctx.install();
    let other = softmax_in("other");
    let stats = |ctx: &gt::frontend::tensor::Context| ctx.with_executor(|c: &mut Client| kernels(c)).unwrap();
    assert_eq!(stats(&ctx), 0, "a signal without compile: true is not compiled");
    let compiled = softmax_in("block");
    assert!(stats(&ctx) >= 1, "the compile signal's region became kernels");
    drop(guard);
    ctx.close();
    assert_eq!(other, reference);
    for (a, b) in compiled.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{compiled:?} vs {reference:?}");
    }
    gt::signal::set_config(Default::default());
}

#[test]
fn gt_run_compiles_the_signal_blocks_a_config_marks() {
    let config = script("compile-signal.yaml", b"layer1:\n  compile: true\n");
    let log = config.with_file_name("log.txt");
    let run = |env: &[(&str, &OsStr)], args: &[&str]| {
        let o = gt_run_env(args, env);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        (stdout(&o), stderr(&o))
    };
    let (plain, _) = run(&[], &["--reference", "examples/mlp.gtir"]);
    let (compiled, stats) = run(
        &[("GT_CONFIG", config.as_os_str()), ("GT_INSTRUCTION_LOG", log.as_os_str())],
        &["--pass-stats", "--dump-after", "fuse", "examples/mlp.gtir"],
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.lines().any(|l| l.contains("| SIGNAL") && l.contains("layer1 depth=1 compile")), "{log}");
    // layer1's matmul, scale, bias and relu became one kernel; nothing else was compiled.
    assert!(stats.contains("pass fuse: regions=1 "), "{stats}");
    assert!(compiled.contains("signal_start \"layer1\" compile\n%0 = fused"), "{compiled}");
    assert!(compiled.contains("%6 = fused %0, %1 : f32[8, 32] kernel matmul"), "{compiled}");
    assert!(compiled.contains("signal_start \"layer2\"\n%7 = randn"), "{compiled}");
    let values = compiled.split("; after fuse").next().unwrap();
    assert_eq!(values, plain);
}

/// Runs `gt-run` on `source` (written as `NAME.gtir`) with `config` as `GT_CONFIG`;
/// (exit code, stdout, stderr).
fn gt_run_with_config(name: &str, source: &str, config: &str, args: &[&str]) -> (i32, String, String) {
    let path = script(&format!("{name}.gtir"), source.as_bytes());
    let config = script(&format!("{name}.yaml"), config.as_bytes());
    let mut args = args.to_vec();
    args.push(path.to_str().unwrap());
    let o = gt_run_env(&args, &[("GT_CONFIG", config.as_os_str())]);
    (code(&o), stdout(&o), stderr(&o))
}

#[test]
fn a_kernel_failure_names_the_line_that_defined_its_value() {
    let script = "%a = full f32[4] 1.0\n%A = zeros f32[65536, 1]\n%B = zeros f32[1, 65537]\nsignal \"s\" {\n  %m = matmul %A, %B\n  %y = exp %a\n  %z = neg %y\n  %w = mul %z, %y\n}\nprint %w\nprint %m\n";
    let (code, _, err) = gt_run_with_config("kernel-failure", script, "s:\n  compile: true\n", &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`matmul` failed: fused: result needs"), "{err}");
    assert!(err.contains("kernel-failure.gtir:5:"), "{err}");
}

#[test]
fn written_signal_markers_follow_the_config_and_only_a_matching_end_closes_a_scope() {
    // `signal_end "t"` does not close the innermost scope ("s"): the dispatcher keeps "s"
    // open, and so does the fuse pass, which compiles the rest of the scope.
    let script = "%a = full f32[4] 1.0\nsignal_start \"t\"\nsignal_start \"s\"\n%y = exp %a\nsignal_end \"t\"\n%z = neg %y\n%w = mul %z, %y\n%v = add %w, 1.0\nprint %v\n";
    let (code, out, err) = gt_run_with_config(
        "written-markers",
        script,
        "s:\n  compile: true\n",
        &["--pass-stats", "--dump-after", "fuse"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("signal_start \"s\" compile\n"), "{out}");
    assert!(err.contains("pass fuse: regions=1 "), "{err}");
    assert!(out.contains("%v = f32[4] [-6.3891, -6.3891"), "{out}");
}
