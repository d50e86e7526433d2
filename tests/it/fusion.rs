//! The fuse pass checked against the interpreter: random elementwise/reduction programs over
//! broadcasting shapes and the canonical fusions (softmax, layer norm, GELU, a linear
//! layer) give the unfused numbers, with the fused kernels evaluated by the kernel oracle
//! and compiled by the JIT. (Every run filetest runs with the pass on in `cluster.rs`.)

use gt_ir::{BinaryOp, DType, Instr, Operand, ReduceOp, TensorType, UnaryOp, ValueId};
use gt_passes::{Emit, Fuse, FuseConfig, StreamPass};
use gt_runtime::backend::cpu::interp::Interpreter;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

/// Runs `stream` through the fuse pass (flushing at the end).
fn fuse(stream: &[Instr], config: FuseConfig) -> (Vec<Instr>, Fuse) {
    let mut pass = Fuse::new(config);
    let mut out = Emit::new("fuse");
    for i in stream {
        pass.run(i.clone(), &mut out);
    }
    pass.flush(&mut out);
    (out.into_items().into_iter().map(|(i, _)| i).collect(), pass)
}

/// Frees every value after its last use, except `keep`.
fn with_frees(instrs: Vec<Instr>, keep: &[ValueId]) -> Vec<Instr> {
    let mut last = HashMap::new();
    for (k, i) in instrs.iter().enumerate() {
        for v in i.operands().into_iter().chain(i.results()) {
            last.insert(v, k);
        }
    }
    let mut out = Vec::new();
    for (k, i) in instrs.into_iter().enumerate() {
        out.push(i);
        let mut dead: Vec<ValueId> =
            last.iter().filter(|(v, &l)| l == k && !keep.contains(v)).map(|(v, _)| *v).collect();
        dead.sort();
        out.extend(dead.into_iter().map(|src| Instr::Free { src }));
    }
    out
}

/// Runs a stream on the interpreter (`fused` kernels on the kernel oracle).
fn run(stream: &[Instr], read: &[ValueId]) -> Vec<Vec<f32>> {
    run_on(Interpreter::new(), stream, read)
}

/// Runs a stream on the interpreter with `fused` kernels compiled by the JIT.
fn run_jit(stream: &[Instr], read: &[ValueId]) -> Vec<Vec<f32>> {
    run_on(Interpreter::new().with_jit(), stream, read)
}

fn run_on(mut interp: Interpreter, stream: &[Instr], read: &[ValueId]) -> Vec<Vec<f32>> {
    for i in stream {
        interp.execute(i).unwrap_or_else(|e| panic!("{e}: {}", gt_ir::text::print_instr(i)));
    }
    read.iter().map(|&v| interp.read(v).unwrap().to_f32()).collect()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// `snapshots/fuse__NAME.snap`: the fused stream.
fn snapshot(name: &str, text: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(format!("fuse__{name}"), text));
}

/// `snapshots/clif__NAME.snap`: the CLIF the CPU JIT makes of each kernel of the stream.
fn clif_snapshot(name: &str, stream: &[Instr]) {
    let text: Vec<String> = stream
        .iter()
        .filter_map(|i| match i {
            Instr::Fused { dst, kernel, .. } => {
                Some(format!("; %{}\n{}", dst.0, gt_runtime::backend::cpu::jit::clif(kernel).unwrap()))
            }
            _ => None,
        })
        .collect();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(format!("clif__{name}"), text.join("\n")));
}

fn kernels(stream: &[Instr]) -> usize {
    stream.iter().filter(|i| matches!(i, Instr::Fused { .. })).count()
}

fn v(n: u32) -> ValueId {
    ValueId(n)
}

/// A program of random ops over values of shapes that all broadcast to `[a, b]`.
#[derive(Debug, Clone)]
enum Step {
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Scalar(BinaryOp, usize, f32),
    Reduce(ReduceOp, usize, bool),
}

fn step() -> impl Strategy<Value = Step> {
    let unary = prop::sample::select(UnaryOp::ALL.to_vec());
    let binary = prop::sample::select(vec![
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Lt,
    ]);
    let reduce = prop::sample::select(ReduceOp::ALL.to_vec());
    prop_oneof![
        3 => (unary, 0usize..64).prop_map(|(o, a)| Step::Unary(o, a)),
        4 => (binary.clone(), 0usize..64, 0usize..64).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        2 => (binary, 0usize..64, prop::sample::select(vec![0.0f32, 1.0, 2.0, -1.0, 0.5])).prop_map(|(o, a, c)| Step::Scalar(o, a, c)),
        2 => (reduce, 0usize..64, any::<bool>()).prop_map(|(o, a, last)| Step::Reduce(o, a, last)),
    ]
}

fn program(a: usize, b: usize, steps: &[Step]) -> (Vec<Instr>, Vec<ValueId>) {
    let shapes = [vec![a, b], vec![b], vec![a, 1], vec![1, b]];
    let mut instrs = Vec::new();
    let mut shape_of: Vec<Vec<usize>> = Vec::new();
    for (k, s) in shapes.iter().enumerate() {
        instrs.push(Instr::Randn { dst: v(k as u32), ty: TensorType::f32(s.clone()), seed: k as u64 + 1 });
        shape_of.push(s.clone());
    }
    let broadcast = |x: &[usize], y: &[usize]| -> Vec<usize> {
        let r = x.len().max(y.len());
        (0..r)
            .map(|i| {
                let d = |s: &[usize]| if i + s.len() >= r { s[i + s.len() - r] } else { 1 };
                d(x).max(d(y))
            })
            .collect()
    };
    // A comparison's bool result is followed by `where %c, 1, 0` (f32); later steps that
    // pick the bool take that instead, so every op sees f32 and kernels compare inside.
    let mut bools: HashSet<usize> = HashSet::new();
    for s in steps {
        let n = shape_of.len();
        let dst = v(n as u32);
        let pick = |x: usize| if bools.contains(&(x % n)) { x % n + 1 } else { x % n };
        let (instr, shape) = match *s {
            Step::Unary(op, x) => (Instr::Unary { dst, op, src: v(pick(x) as u32) }, shape_of[pick(x)].clone()),
            Step::Binary(op, x, y) => {
                let (x, y) = (pick(x), pick(y));
                let lhs = Operand::Value(v(x as u32));
                let rhs = Operand::Value(v(y as u32));
                (Instr::Binary { dst, op, lhs, rhs }, broadcast(&shape_of[x], &shape_of[y]))
            }
            Step::Scalar(op, x, c) => {
                let x = pick(x);
                let instr = Instr::Binary { dst, op, lhs: Operand::Value(v(x as u32)), rhs: Operand::Scalar(c.into()) };
                (instr, shape_of[x].clone())
            }
            Step::Reduce(op, x, last) => {
                let x = pick(x);
                let rank = shape_of[x].len();
                if rank < 2 {
                    continue;
                }
                // keepdim keeps the shape broadcastable to [a, b].
                let axis = if last { 1 } else { 0 };
                let mut shape = shape_of[x].clone();
                shape[axis] = 1;
                (Instr::Reduce { dst, op, src: v(x as u32), axes: Some(vec![axis as i64]), keepdim: true }, shape)
            }
        };
        let compare = matches!(&instr, Instr::Binary { op, .. } if op.is_comparison());
        instrs.push(instr);
        shape_of.push(shape.clone());
        if compare {
            bools.insert(n);
            let (on_true, on_false) = (Operand::Scalar(1.0), Operand::Scalar(0.0));
            instrs.push(Instr::Where { dst: v(n as u32 + 1), cond: dst, on_true, on_false });
            shape_of.push(shape);
        }
    }
    // Read the last value and one in the middle; everything else dies.
    let last = v(shape_of.len() as u32 - 1);
    let mid = v((shape_of.len() as u32 - 1).div_ceil(2).max(4));
    let read = if mid >= last { vec![last] } else { vec![mid, last] };
    (instrs, read)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_programs_fused_equal_unfused(a in 1usize..7, b in 1usize..9, steps in prop::collection::vec(step(), 1..12)) {
        let (instrs, read) = program(a, b, &steps);
        let stream = with_frees(instrs, &read);
        let (fused, pass) = fuse(&stream, FuseConfig::default());
        let expected = run(&stream, &read);
        let found = run(&fused, &read);
        // Exp, tanh and friends are polynomials in the JIT (within 2 ulp each), and errors
        // compound along a chain.
        let jit = run_jit(&fused, &read);
        for (x, y) in jit.iter().zip(&expected) {
            prop_assert!(close(x, y, 1e-4), "JIT {:?}\nunfused {:?}", x, y);
        }
        for (x, y) in found.iter().zip(&expected) {
            prop_assert!(close(x, y, 1e-5), "fused {:?}\nunfused {:?}\nstream:\n{}\nfused:\n{}", x, y,
                stream.iter().map(gt_ir::text::print_instr).collect::<Vec<_>>().join("\n"),
                fused.iter().map(gt_ir::text::print_instr).collect::<Vec<_>>().join("\n"));
        }
        prop_assert_eq!(pass.fuse_stats().fallbacks, 0);
        prop_assert!(kernels(&fused) >= 1, "nothing fused:\n{:?}", fused);
    }
}

/// `program` with its inputs made as `dtype` (everything after follows by promotion), and
/// its f32 reference: the same inputs (made as `dtype`, then cast to `f32`), every op in
/// `f32`.
fn program_in(dtype: DType, a: usize, b: usize, steps: &[Step]) -> (Vec<Instr>, Vec<Instr>, ValueId) {
    let (instrs, read) = program(a, b, steps);
    let mut typed = Vec::new();
    let mut reference = Vec::new();
    for i in instrs {
        match i {
            Instr::Randn { dst, ty, seed } => {
                let ty = TensorType { dtype, ..ty };
                typed.push(Instr::Randn { dst, ty: ty.clone(), seed });
                let made = ValueId(10_000 + dst.0);
                reference.push(Instr::Randn { dst: made, ty, seed });
                reference.push(Instr::Cast { dst, src: made, dtype: DType::F32 });
            }
            i => {
                typed.push(i.clone());
                reference.push(i);
            }
        }
    }
    let last = *read.last().unwrap();
    (with_frees(typed, &[last]), with_frees(reference, &[last]), last)
}

/// `program` over `dtype` (`f64`, `i64` or `i32`) with only ops that keep it (for
/// integers: `neg abs relu add sub mul maximum minimum lt`, integer scalars, `sum max min`,
/// a `sum` of `i32` giving `i64`: the others are changed into these): inputs `randn` made as `f64`, or `randn * 50000` cast to
/// the integer dtype; each comparison's `where` picks between the compared values. Returns
/// the stream and the values it reads.
fn program_of(dtype: DType, a: usize, b: usize, steps: &[Step]) -> (Vec<Instr>, Vec<ValueId>) {
    let integer = dtype != DType::F64;
    // Float-only ops become integer ones: a unary op one of `neg abs relu`, `/` a `*`, a
    // fractional scalar doubled, `mean` a `sum`.
    let keeping = |s: &Step| match *s {
        _ if !integer => s.clone(),
        Step::Unary(op, x) => Step::Unary([UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu][op as usize % 3], x),
        Step::Binary(BinaryOp::Div, x, y) => Step::Binary(BinaryOp::Mul, x, y),
        Step::Scalar(op, x, c) => {
            let op = if op == BinaryOp::Div { BinaryOp::Mul } else { op };
            Step::Scalar(op, x, if c.fract() == 0.0 { c } else { 2.0 * c })
        }
        Step::Reduce(ReduceOp::Mean, x, last) => Step::Reduce(ReduceOp::Sum, x, last),
        _ => s.clone(),
    };
    let steps: Vec<Step> = steps.iter().map(keeping).collect();
    let (instrs, read) = program(a, b, &steps);
    let mut out = Vec::new();
    let mut compared: HashMap<ValueId, (Operand, Operand)> = HashMap::new();
    for i in instrs {
        match i {
            Instr::Randn { dst, ty, seed } if integer => {
                let (made, scaled) = (ValueId(10_000 + dst.0), ValueId(20_000 + dst.0));
                out.push(Instr::Randn { dst: made, ty, seed });
                let big = Operand::Scalar(50_000.0);
                out.push(Instr::Binary { dst: scaled, op: BinaryOp::Mul, lhs: Operand::Value(made), rhs: big });
                out.push(Instr::Cast { dst, src: scaled, dtype });
            }
            Instr::Randn { dst, ty, seed } => out.push(Instr::Randn { dst, ty: TensorType { dtype, ..ty }, seed }),
            Instr::Binary { dst, op, lhs, rhs } if op.is_comparison() => {
                compared.insert(dst, (lhs, rhs));
                out.push(i);
            }
            Instr::Where { dst, cond, .. } => {
                let (on_true, on_false) = compared[&cond];
                out.push(Instr::Where { dst, cond, on_true, on_false });
            }
            i => out.push(i),
        }
    }
    (out, read)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// `f64` and integer programs, fused (kernels computing in `f64` or `i64`, an `i32`
    /// result wrapped back after each op) and run with the JIT and with the oracle, give
    /// the eager ops' bits: integer overflow wraps where the eager ops wrap.
    #[test]
    fn fused_f64_and_integer_programs_give_the_eager_bits(
        which in 0usize..3, a in 1usize..7, b in 1usize..9,
        steps in prop::collection::vec(step(), 1..16),
    ) {
        let dtype = [DType::F64, DType::I64, DType::I32][which];
        let (instrs, read) = program_of(dtype, a, b, &steps);
        let stream = with_frees(instrs, &read);
        let (fused, pass) = fuse(&stream, FuseConfig::default());
        let text = |s: &[Instr]| s.iter().map(gt_ir::text::print_instr).collect::<Vec<_>>().join("\n");
        prop_assert_eq!(pass.fuse_stats().fallbacks, 0, "stream:\n{}\nfused:\n{}", text(&stream), text(&fused));
        let reads = |mut interp: Interpreter, stream: &[Instr]| {
            for i in stream {
                interp.execute(i).unwrap_or_else(|e| panic!("{e}: {}", gt_ir::text::print_instr(i)));
            }
            read.iter().map(|&v| interp.read(v).unwrap()).collect::<Vec<_>>()
        };
        let expected = reads(Interpreter::new(), &stream);
        for found in [reads(Interpreter::new(), &fused), reads(Interpreter::new().with_jit(), &fused)] {
            for (x, y) in found.iter().zip(&expected) {
                prop_assert_eq!(&x.ty, &y.ty);
                let same = match (&x.data, &y.data) {
                    (gt_ir::data::Elements::F64(x), gt_ir::data::Elements::F64(y)) => {
                        x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
                    }
                    (x, y) => x == y,
                };
                prop_assert!(same, "fused {:?}\nunfused {:?}\nstream:\n{}\nfused:\n{}", x.data, y.data, text(&stream), text(&fused));
            }
        }
        // Every elementwise op of the program's dtypes is inside a kernel (comparisons whose
        // bool is read stay: kernels write no bools).
        let kept = fused.iter().find(|i| match i {
            Instr::Unary { .. } | Instr::Where { .. } => true,
            Instr::Binary { op, .. } => !op.is_comparison() && !i.operands().iter().any(|v| v.0 >= 10_000),
            _ => false,
        });
        prop_assert!(kept.is_none(), "not fused: {:?}\n{}", kept, text(&fused));
    }
}

/// `x` as `dtype` holds it.
fn rounded(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// One unit in the last place of `x` as `dtype` holds it.
fn ulp(x: f32, dtype: DType) -> f32 {
    let bits = match dtype {
        DType::F16 => 10,
        DType::BF16 => 7,
        _ => 23,
    };
    let exponent = if x == 0.0 || !x.is_finite() { -14 } else { x.abs().log2().floor() as i32 };
    2f32.powi(exponent.max(-14) - bits)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Kernels compute in f32 over halves: an elementwise program over `f16` or `bf16`
    /// inputs, fused, gives what the same program computed in `f32` gives, rounded once
    /// (within the one ulp a rounding boundary between the JIT's f32 and the
    /// interpreter's can flip). Eager ops round at every step instead.
    #[test]
    fn fused_halves_compute_in_f32_and_round_once(
        half in any::<bool>(), a in 1usize..7, b in 1usize..9,
        steps in prop::collection::vec(step(), 1..12),
    ) {
        let dtype = if half { DType::F16 } else { DType::BF16 };
        let steps: Vec<Step> = steps.into_iter().filter(|s| !matches!(s, Step::Reduce(..))).collect();
        prop_assume!(!steps.is_empty());
        let (typed, reference, last) = program_in(dtype, a, b, &steps);
        let (fused, pass) = fuse(&typed, FuseConfig::default());
        prop_assert_eq!(pass.fuse_stats().fallbacks, 0);
        prop_assert!(kernels(&fused) >= 1, "nothing fused:\n{:?}", fused);
        let mut jit = Interpreter::new().with_jit();
        for i in &fused {
            jit.execute(i).unwrap_or_else(|e| panic!("{e}: {}", gt_ir::text::print_instr(i)));
        }
        let got = jit.read(last).unwrap();
        let want = run(&reference, &[last]).remove(0);
        let read_dtype = got.ty.dtype;
        for (&x, &y) in got.to_f32().iter().zip(&want) {
            let y = rounded(y, read_dtype);
            prop_assert!(
                (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= ulp(y, read_dtype) + 1e-4 * (1.0 + y.abs()),
                "{read_dtype}: fused {x} vs f32 rounded once {y}\nfused:\n{}",
                fused.iter().map(gt_ir::text::print_instr).collect::<Vec<_>>().join("\n")
            );
        }
    }
}

#[test]
fn a_chain_of_halves_is_one_kernel_rounding_once() {
    // x * 2 + 1, tanh, exp, * x, sigmoid: one kernel; the eager chain rounds five times.
    let src = "%x = randn bf16[64, 33] seed=7
%a = mul %x, 2.0
%b = add %a, 1.0
%c = tanh %b
%d = exp %c
%e = mul %d, %x
%y = sigmoid %e
";
    let (instrs, names) = parse(src);
    let y = names["y"];
    let stream = with_frees(instrs, &[y]);
    let (fused, _) = fuse(&stream, FuseConfig::default());
    assert_eq!(kernels(&fused), 1, "{fused:?}");
    let mut jit = Interpreter::new().with_jit();
    for i in &fused {
        jit.execute(i).unwrap();
    }
    let got = jit.read(y).unwrap();
    assert_eq!(got.ty.dtype, DType::BF16);
    // The reference: the same bf16 inputs, every op in f32, one rounding at the end. The
    // JIT's transcendental functions are the interpreter's bit for bit, so this is exact.
    let reference =
        src.replacen("%x = randn bf16[64, 33] seed=7", "%x0 = randn bf16[64, 33] seed=7\n%x = cast %x0 f32", 1);
    let (instrs, names) = parse(&reference);
    let want = run(&with_frees(instrs, &[names["y"]]), &[names["y"]]).remove(0);
    let want: Vec<f32> = want.iter().map(|&v| rounded(v, DType::BF16)).collect();
    assert_eq!(got.to_f32(), want);
    // And the eager chain, rounding at each step, is not that (so the test can tell).
    let eager = run(&stream, &[y]).remove(0);
    assert_ne!(eager, want);
}

/// Parses a program's instructions (no script statements).
fn parse(src: &str) -> (Vec<Instr>, HashMap<String, ValueId>) {
    let p = gt_ir::text::parse(src).unwrap();
    let names = p.names.iter().enumerate().map(|(i, n)| (n.clone(), ValueId(i as u32))).collect();
    (p.instrs().into_iter().map(|(i, _)| i.clone()).collect(), names)
}

/// Fuses a program reading `out`, checks the numbers and returns the fused stream's text.
fn fused_program(src: &str, out: &str) -> (Vec<Instr>, String) {
    let (instrs, names) = parse(src);
    let read = [names[out]];
    let stream = with_frees(instrs, &read);
    let (fused, _) = fuse(&stream, FuseConfig::default());
    let (expected, found, jit) = (run(&stream, &read), run(&fused, &read), run_jit(&fused, &read));
    assert!(close(&found[0], &expected[0], 1e-5), "{found:?} vs {expected:?}");
    assert!(close(&jit[0], &expected[0], 1e-5), "JIT {jit:?} vs {expected:?}");
    let text = fused.iter().map(gt_ir::text::print_instr).collect::<Vec<_>>().join("\n");
    (fused, text)
}

#[test]
fn softmax_is_one_kernel() {
    let (fused, text) = fused_program(
        "%x = randn f32[6, 33] seed=3
         %m = max %x axes=[-1] keepdim
         %s = sub %x, %m
         %e = exp %s
         %z = sum %e axes=[-1] keepdim
         %y = div %e, %z",
        "y",
    );
    // The softmax is one kernel; its `randn` input another (a row kernel reads a `randn`
    // from memory rather than computing it on each pass).
    assert_eq!(kernels(&fused), 2, "{text}");
    snapshot("softmax", &text);
    clif_snapshot("softmax", &fused);
}

#[test]
fn layer_norm_is_one_kernel() {
    let (fused, text) = fused_program(
        "%x = randn f32[4, 50] seed=4
         %g = randn f32[50] seed=5
         %mu = mean %x axes=[-1] keepdim
         %d = sub %x, %mu
         %sq = mul %d, %d
         %var = mean %sq axes=[-1] keepdim
         %ve = add %var, 1e-5
         %r = rsqrt %ve
         %n = mul %d, %r
         %y = mul %n, %g",
        "y",
    );
    // The layer norm is one kernel; each `randn` input another (`%x` read by a row kernel,
    // `%g` read broadcast).
    assert_eq!(kernels(&fused), 3, "{text}");
    snapshot("layer_norm", &text);
    clif_snapshot("layer_norm", &fused);
}

#[test]
fn gelu_is_one_kernel() {
    let (fused, text) = fused_program(
        "%x = randn f32[1000] seed=6
         %x3 = pow %x, 3
         %a = mul %x3, 0.044715
         %b = add %x, %a
         %c = mul %b, 0.7978845608
         %t = tanh %c
         %u = add %t, 1
         %h = mul %x, 0.5
         %y = mul %h, %u",
        "y",
    );
    assert_eq!(kernels(&fused), 1, "{text}");
    snapshot("gelu", &text);
    clif_snapshot("gelu", &fused);
}

#[test]
fn linear_relu_is_one_matmul_with_its_epilogue() {
    let (fused, text) = fused_program(
        "%x = randn f32[8, 16] seed=7
         %w = randn f32[16, 4] seed=8
         %b = randn f32[4] seed=9
         %p = matmul %x, %w
         %q = add %p, %b
         %y = relu %q",
        "y",
    );
    // x, w and b are created in the region, then one matmul kernel with bias + relu.
    let matmuls = fused
        .iter()
        .filter(|i| matches!(i, Instr::Fused { kernel, .. } if matches!(**kernel, gt_ir::kernel::Kernel::MatMul(_))))
        .count();
    assert_eq!(matmuls, 1, "{text}");
    // Top-level lines are instructions; kernel bodies are indented.
    let top: Vec<&str> = text.lines().filter(|l| !l.starts_with(' ')).collect();
    assert!(!top.iter().any(|l| l.contains("= matmul") || l.contains("= relu") || l.contains("= add")), "{text}");
    snapshot("linear_relu", &text);
    clif_snapshot("linear_relu", &fused);
}

#[test]
fn live_values_are_written_and_dead_ones_never() {
    // %e is read after the region (not freed): it must be materialised; %s dies inside.
    let (instrs, names) = parse(
        "%x = randn f32[4, 8] seed=1
         %s = mul %x, 2
         %e = exp %s
         %y = add %e, 1",
    );
    let read = [names["e"], names["y"]];
    let stream = with_frees(instrs, &read);
    let (fused, pass) = fuse(&stream, FuseConfig::default());
    let defined: Vec<ValueId> = fused.iter().flat_map(|i| i.results()).collect();
    assert!(defined.contains(&names["e"]) && defined.contains(&names["y"]));
    assert!(!defined.contains(&names["s"]), "{fused:?}");
    assert!(pass.fuse_stats().elided >= 1);
    assert_eq!(run(&fused, &read), run(&stream, &read));
}

#[test]
fn views_become_strided_reads() {
    // y = exp(transpose(x))[1:, ::2] + 1: no copy of the transpose or the slice.
    let (fused, text) = fused_program(
        "%x = randn f32[6, 5] seed=2
         %t = transpose %x dim0=0 dim1=1
         %s = slice %t [1:, ::2]
         %e = exp %s
         %y = add %e, 1",
        "y",
    );
    assert_eq!(kernels(&fused), 2, "{text}");
    assert!(!text.contains("transpose") && !text.contains("slice"), "{text}");
}

#[test]
fn a_fused_full_reduction_lowers_to_two_passes_with_the_same_sum() {
    use gt_ir::kernel::lower::{lower, Step};
    use gt_runtime::backend::cpu::kernels::KernelBackend;
    use gt_runtime::backend::Backend;
    // 2^18 elements: long enough for the two-pass split that GPUs use.
    let (instrs, names) = parse(
        "%x = randn f32[512, 512] seed=11
         %i = arange f32 end=512
         %e = exp %x
         %m = mul %e, %i
         %s = sum %m",
    );
    let read = [names["s"]];
    let stream = with_frees(instrs, &read);
    let (fused, _) = fuse(&stream, FuseConfig::default());
    let last = fused.iter().rfind(|i| matches!(i, Instr::Fused { .. })).expect("a fused reduction");
    let types: HashMap<ValueId, TensorType> =
        [(names["x"], TensorType::f32(vec![512, 512])), (names["i"], TensorType::f32(vec![512]))].into();
    let steps =
        lower(last, &|v| types.get(&v).cloned().unwrap_or(TensorType::f32(vec![512, 512])), &[TensorType::f32(vec![])]);
    assert!(matches!(steps[..], [Step::TwoPass { .. }]), "{steps:?}");
    let mut backend = KernelBackend::new(1 << 30);
    for i in &fused {
        backend.execute(i).unwrap();
    }
    let found = backend.read(names["s"]).unwrap().to_f32();
    let expected = run(&stream, &read);
    assert!(close(&found, &expected[0], 1e-5), "{found:?} vs {expected:?}");
}

#[test]
fn a_region_seen_before_under_other_names_reuses_its_kernels() {
    // Two steps of the same computation with fresh ids, split by a sync point (a flush):
    // the second is the first renamed.
    let step = |x: u32, base: u32| {
        let (a, b, c) = (v(base), v(base + 1), v(base + 2));
        vec![
            Instr::Binary { dst: a, op: BinaryOp::Mul, lhs: Operand::Value(v(x)), rhs: Operand::Scalar(2.0) },
            Instr::Unary { dst: b, op: UnaryOp::Exp, src: a },
            Instr::Free { src: a },
            Instr::Binary { dst: c, op: BinaryOp::Add, lhs: Operand::Value(b), rhs: Operand::Value(v(x)) },
            Instr::Free { src: b },
        ]
    };
    let x = Instr::Randn { dst: v(0), ty: TensorType::f32(vec![3, 5]), seed: 1 };
    let mut pass = Fuse::new(FuseConfig::default());
    let mut out = Emit::new("fuse");
    pass.run(x.clone(), &mut out);
    pass.flush(&mut out);
    for (k, base) in [(0, 10), (1, 20)] {
        let _ = k;
        for i in step(0, base) {
            pass.run(i, &mut out);
        }
        pass.flush(&mut out);
    }
    let stream: Vec<Instr> = out.into_items().into_iter().map(|(i, _)| i).collect();
    assert_eq!(pass.fuse_stats().cache_hits, 1, "{stream:?}");
    assert_eq!(kernels(&stream), 2);
    let mut unfused = vec![x];
    unfused.extend(step(0, 10));
    unfused.extend(step(0, 20));
    assert_eq!(run(&stream, &[v(12), v(22)]), run(&unfused, &[v(12), v(22)]));
}

#[test]
fn regions_alike_but_for_a_literals_data_or_a_type_compile_apart() {
    // The cache's key leaves a literal's data out (as structure hashes do), so the second
    // region has the first one's key: the exact check must tell them apart, or its kernels
    // would read the first literal. A type changes the key itself.
    let step = |base: u32, data: Vec<f32>, n: usize| {
        let (k, a, b) = (v(base), v(base + 1), v(base + 2));
        vec![
            Instr::Literal { dst: k, ty: TensorType::f32(vec![n]), data: data.into() },
            Instr::Binary { dst: a, op: BinaryOp::Mul, lhs: Operand::Value(k), rhs: Operand::Scalar(2.0) },
            Instr::Unary { dst: b, op: UnaryOp::Exp, src: a },
            Instr::Free { src: a },
            Instr::Free { src: k },
        ]
    };
    let steps = [step(10, vec![0.5, 1.0, 1.5], 3), step(20, vec![-1.0, 0.0, 2.0], 3), step(30, vec![0.25, 4.0], 2)];
    let mut pass = Fuse::new(FuseConfig::default());
    let mut out = Emit::new("fuse");
    for s in &steps {
        for i in s.clone() {
            pass.run(i, &mut out);
        }
        pass.flush(&mut out);
    }
    let stream: Vec<Instr> = out.into_items().into_iter().map(|(i, _)| i).collect();
    assert_eq!(pass.fuse_stats().cache_hits, 0, "{stream:?}");
    let unfused: Vec<Instr> = steps.concat();
    let read = [v(12), v(22), v(32)];
    assert_eq!(run(&stream, &read), run(&unfused, &read));
    // The same data again is a hit.
    let mut out = Emit::new("fuse");
    for i in step(40, vec![-1.0, 0.0, 2.0], 3) {
        pass.run(i, &mut out);
    }
    pass.flush(&mut out);
    assert_eq!(pass.fuse_stats().cache_hits, 1);
}

/// One step of a training-like loop with fresh ids from `*next`: the loss `s` first (so a
/// kernel can go before the step ends), then `w` updated; `c = add b, bump` (1.0 in a
/// step like the others). The previous step's loss is freed first (a value the step does
/// not otherwise name). Only its first `keep` instructions when given (a step cut short).
fn hot_step(next: &mut u32, w: &mut ValueId, s: &mut Option<ValueId>, bump: f64, keep: Option<usize>) -> Vec<Instr> {
    let mut id = || {
        *next += 1;
        v(*next)
    };
    let (a, b, l, c, nw) = (id(), id(), id(), id(), id());
    let mut step: Vec<Instr> = s.map(|src| Instr::Free { src }).into_iter().collect();
    step.extend([
        Instr::Binary { dst: a, op: BinaryOp::Mul, lhs: Operand::Value(v(0)), rhs: Operand::Value(*w) },
        Instr::Unary { dst: b, op: UnaryOp::Tanh, src: a },
        Instr::Free { src: a },
        Instr::Reduce { dst: l, op: ReduceOp::Sum, src: b, axes: None, keepdim: false },
        Instr::Binary { dst: c, op: BinaryOp::Add, lhs: Operand::Value(b), rhs: Operand::Scalar(bump) },
        Instr::Free { src: b },
        Instr::Binary { dst: nw, op: BinaryOp::Sub, lhs: Operand::Value(*w), rhs: Operand::Value(c) },
        Instr::Free { src: c },
        Instr::Free { src: *w },
    ]);
    step.truncate(keep.unwrap_or(step.len()));
    let defines = |x: ValueId| step.iter().any(|i| i.results().contains(&x));
    if defines(nw) {
        *w = nw;
    }
    if defines(l) {
        *s = Some(l);
    } else if s.is_some_and(|p| step.iter().any(|i| matches!(i, Instr::Free { src } if *src == p))) {
        *s = None;
    }
    step
}

/// `stream` through the hotpath and fuse passes, one instruction at a time; the output, and
/// for each input instruction how many instructions had come out after it.
fn hot_fuse(stream: &[Instr]) -> (Vec<Instr>, Vec<usize>, Fuse) {
    let mut hot = gt_passes::HotPath::new(gt_passes::HotPathConfig::default());
    let mut pass = Fuse::new(FuseConfig { regions: gt_passes::Regions::HotPaths, ..FuseConfig::default() });
    let mut out = Emit::new("fuse");
    let mut after = Vec::new();
    for i in stream {
        let mut marked = Emit::new("hotpath");
        hot.run(i.clone(), &mut marked);
        for (i, _) in marked.into_items() {
            pass.run(i, &mut out);
        }
        after.push(out.len());
    }
    let mut marked = Emit::new("hotpath");
    hot.flush(&mut marked);
    for (i, _) in marked.into_items() {
        pass.run(i, &mut out);
    }
    pass.flush(&mut out);
    (out.into_items().into_iter().map(|(i, _)| i).collect(), after, pass)
}

/// `steps` [`hot_step`]s after the inputs, step `k` with `bump(k)` and `keep(k)`; the stream
/// and the values it leaves (the weights, and the last loss if one is left).
fn hot_loop(
    steps: usize,
    bump: impl Fn(usize) -> f64,
    keep: impl Fn(usize) -> Option<usize>,
) -> (Vec<Instr>, Vec<ValueId>) {
    let (mut next, mut w, mut s) = (10, v(1), None);
    let mut stream = vec![
        Instr::Randn { dst: v(0), ty: TensorType::f32(vec![6, 5]), seed: 1 },
        Instr::Randn { dst: v(1), ty: TensorType::f32(vec![6, 5]), seed: 2 },
    ];
    for k in 0..steps {
        stream.extend(hot_step(&mut next, &mut w, &mut s, bump(k), keep(k)));
    }
    (stream, [w].into_iter().chain(s).collect())
}

/// `fused` leaves the values `read` as `stream` does, within rounding.
fn assert_same_values(stream: &[Instr], fused: &[Instr], read: &[ValueId]) {
    for (a, b) in run(stream, read).iter().zip(&run(fused, read)) {
        assert!(close(a, b, 1e-5), "{a:?} vs {b:?}");
    }
}

#[test]
fn a_hot_paths_repetitions_stream_from_its_plan_kernels_going_before_the_step_ends() {
    let (stream, read) = hot_loop(12, |_| 1.0, |_| None);
    let (out, after, pass) = hot_fuse(&stream);
    let stats = pass.fuse_stats();
    assert!(stats.streamed >= 5, "{stats:?}");
    // The detector's repetitions need not start where a step does: the stream's end may cut
    // the last one.
    assert!(stats.stream_breaks <= 1, "{stats:?}");
    // In a repetition, the loss's kernel went out before the repetition's last instruction
    // came: `came[k]` is the input instruction after which output `k` went.
    let came = |k: usize| after.iter().position(|&n| n > k).unwrap();
    let starts: Vec<usize> = (0..out.len()).filter(|&k| matches!(out[k], Instr::HotPathStart { .. })).collect();
    let start = starts[starts.len() / 2];
    let end = start + out[start..].iter().position(|i| matches!(i, Instr::HotPathEnd { .. })).unwrap();
    let first = start + out[start..end].iter().position(|i| matches!(i, Instr::Fused { .. })).unwrap();
    assert!(came(first) < came(end), "{:?}", &out[start..=end]);
    assert_same_values(&stream, &out, &read);
}

#[test]
fn a_repetition_that_breaks_off_its_plan_computes_again_what_went_unwritten() {
    // The 9th step changes `c` after its loss's kernel went: what that kernel computed
    // inside (tanh of the product, which `c` reads) must be computed again.
    let (stream, read) = hot_loop(12, |k| if k == 8 { 2.0 } else { 1.0 }, |_| None);
    let (out, _, pass) = hot_fuse(&stream);
    let stats = pass.fuse_stats();
    assert_eq!(stats.stream_breaks, 1, "{stats:?}");
    assert!(stats.streamed >= 4, "{stats:?}");
    assert_same_values(&stream, &out, &read);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Repetitions streamed from a plan, some breaking off it (another op) or cut short (a
    /// step ends early), leave the values the unfused stream leaves.
    #[test]
    fn streamed_repetitions_that_break_off_anywhere_give_the_unfused_values(
        steps in 4usize..14,
        odd in proptest::collection::vec((0usize..14, 0usize..11, any::<bool>()), 0..3),
    ) {
        let bump = |k: usize| if odd.iter().any(|&(at, _, other)| at == k && other) { 3.0 } else { 1.0 };
        let keep = |k: usize| odd.iter().find(|&&(at, _, other)| at == k && !other).map(|&(_, keep, _)| keep);
        let (stream, read) = hot_loop(steps, bump, keep);
        let (out, _, _) = hot_fuse(&stream);
        for (a, b) in run(&stream, &read).iter().zip(&run(&out, &read)) {
            prop_assert!(close(a, b, 1e-5), "{a:?} vs {b:?}");
        }
    }
}

/// A loop-carried chain where each step reads the previous one twice (as an optimizer's
/// state does): the expression is a DAG whose tree form has 2^60 leaves. The pass must walk
/// it as a DAG (it once walked it as a tree and never finished), and give the same values.
#[test]
fn shared_chains_fuse_as_dags() {
    let mut src = String::from("%x0 = tensor f32[3] [0.5, -0.25, 0.125]\n");
    for k in 1..=60 {
        src.push_str(&format!("%a{k} = mul %x{p}, 0.5\n%x{k} = add %a{k}, %x{p}\n", p = k - 1));
    }
    let (stream, names) = parse(&src);
    let last = names["x60"];
    let stream = with_frees(stream, &[last]);
    let (fused, pass) = fuse(&stream, FuseConfig::default());
    assert_eq!(kernels(&fused), 1, "{fused:?}");
    assert_eq!(pass.fuse_stats().fallbacks, 0);
    let (want, got) = (run(&stream, &[last]), run_jit(&fused, &[last]));
    assert!(close(&got[0], &want[0], 1e-4), "{got:?} vs {want:?}");
}

/// A chain of `f64` ops deeper than one kernel's emission bound is cut into several kernels
/// at the values the bound reaches (not left eager), and gives the eager bits.
#[test]
fn a_long_f64_chain_is_cut_into_kernels() {
    let ops = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub];
    let mut instrs = vec![Instr::Randn { dst: v(0), ty: TensorType::new(DType::F64, vec![64]), seed: 1 }];
    for k in 1..150u32 {
        let (lhs, rhs) = (Operand::Value(v(k - 1)), Operand::Scalar(1.0001));
        instrs.push(Instr::Binary { dst: v(k), op: ops[k as usize % 3], lhs, rhs });
    }
    let stream = with_frees(instrs, &[v(149)]);
    let (fused, pass) = fuse(&stream, FuseConfig::default());
    let eager = fused.iter().filter(|i| matches!(i, Instr::Binary { .. })).count();
    assert!(kernels(&fused) >= 3 && eager <= 3, "{} kernels, {eager} ops left eager", kernels(&fused));
    assert!(pass.fuse_stats().fallbacks <= 3);
    let read = |mut interp: Interpreter, s: &[Instr]| {
        for i in s {
            interp.execute(i).unwrap();
        }
        interp.read(v(149)).unwrap().data
    };
    assert_eq!(read(Interpreter::new().with_jit(), &fused), read(Interpreter::new(), &stream));
}
