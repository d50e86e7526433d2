//! The JIT against the kernel oracle (`kernels::run`): every kernel the lowering makes of
//! the run filetests and examples, the sample fused kernels at sizes with vector tails,
//! strided/broadcast/backwards accesses, reductions over any axes, empty shapes, special
//! values, the transcendental functions over wide ranges, and random expression DAGs.

use super::*;
use crate::backend::checks;
use crate::backend::cpu::kernels;
use crate::backend::cpu::value::Value;
use crate::Interpreter;
use gt_ir::data::Elements;
use gt_ir::kernel::lower::{lower, Step};
use gt_ir::kernel::{samples, Access, Buffer, Compute, Node};
use gt_ir::{BinaryOp, ReduceOp, TypeError, UnaryOp};
use proptest::prelude::*;

/// How closely the JIT must match the oracle.
#[derive(Debug, Clone, Copy)]
enum Tol {
    /// Same bits (any NaN equals any NaN).
    Exact,
    /// `|a - b| <= abs + rel * max(|a|, |b|)`; infinities and NaN must agree exactly, and
    /// `-0 == +0`.
    Close { rel: f32, abs: f32 },
}

fn agrees(want: f32, got: f32, tol: Tol) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    match tol {
        Tol::Exact => want.to_bits() == got.to_bits(),
        Tol::Close { rel, abs } => {
            want == got
                || (want.is_finite() && got.is_finite() && (want - got).abs() <= abs + rel * want.abs().max(got.abs()))
        }
    }
}

/// A value no kernel computes, so elements a kernel does not write compare equal.
const UNWRITTEN: f32 = -12345.625;

/// Runs `kernel` on the oracle and the JIT; the first disagreement, if any.
fn compare(jit: &mut Jit, kernel: &Kernel, inputs: &[&[f32]], len: usize, tol: Tol) -> Result<Vec<f32>, String> {
    let mut want = vec![UNWRITTEN; len];
    kernels::run(kernel, inputs, &mut want).map_err(|e| format!("oracle: {e}"))?;
    let mut got = vec![UNWRITTEN; len];
    jit.run(kernel, inputs, &mut got).map_err(|e| e.to_string())?;
    for (i, (&w, &g)) in want.iter().zip(&got).enumerate() {
        if !agrees(w, g, tol) {
            return Err(format!(
                "element {i}: oracle {w:e} ({:#x}), jit {g:e} ({:#x})\n{kernel}",
                w.to_bits(),
                g.to_bits()
            ));
        }
    }
    Ok(want)
}

#[track_caller]
fn check(jit: &mut Jit, kernel: &Kernel, inputs: &[&[f32]], len: usize, tol: Tol) {
    if let Err(e) = compare(jit, kernel, inputs, len, tol) {
        panic!("{e}");
    }
}

/// Deterministic pseudo-random values in `[lo, hi)`.
fn values(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n as u64).map(|i| lo + (hi - lo) * random::uniform(seed, i)).collect()
}

/// Whether the JIT computes `op` exactly as the oracle does (IEEE basic operations), rather
/// than approximating it (polynomials; composites over them, conservatively).
fn exact(op: UnaryOp) -> bool {
    use gt_ir::{OpDef, UnaryPrim};
    match op.def() {
        OpDef::Prim(p) => match p {
            UnaryPrim::Neg | UnaryPrim::Abs | UnaryPrim::Relu | UnaryPrim::Sqrt | UnaryPrim::Rsqrt => true,
            UnaryPrim::Exp | UnaryPrim::Log | UnaryPrim::Tanh | UnaryPrim::Sigmoid | UnaryPrim::Erf => false,
        },
        OpDef::Composite(_) => false,
    }
}

fn is_transcendental(nodes: &[Node]) -> bool {
    nodes.iter().any(|n| matches!(n, Node::Unary(op, _) if !exact(*op)) || matches!(n, Node::Reduce(..)))
}

/// The tolerance a kernel is held to: exact unless it approximates or reduces.
fn tolerance(kernel: &Kernel) -> Tol {
    let (nodes, reduces) = match kernel {
        Kernel::Map(k) => (&k.nodes[..], k.reduce.is_some()),
        Kernel::MatMul(k) => (&k.epilogue[..], true),
    };
    if reduces || is_transcendental(nodes) {
        Tol::Close { rel: 2e-6, abs: 1e-30 }
    } else {
        Tol::Exact
    }
}

/// A JIT compiling every kernel (the code under test here; `tiles.rs` is checked against it
/// at the end).
fn jit() -> Jit {
    Jit::new().expect("the host has a Cranelift backend").compiling_all()
}

fn map(shape: &[usize], inputs: Vec<Access>, nodes: Vec<Node>, output: Access) -> Kernel {
    Kernel::Map(MapKernel {
        shape: shape.to_vec(),
        inputs,
        nodes,
        output,
        rows: vec![],
        reduce: None,
        compute: Compute::F32,
    })
}

#[test]
fn every_lowered_instruction_of_the_scripts_matches_the_oracle() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["tests/gtir/run", "examples"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
        files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "gtir")));
    }
    files.sort();
    let mut jit = jit();
    let (mut kernels_checked, mut exact, mut wide) = (0, 0, 0);
    for path in &files {
        let Ok(src) = std::fs::read_to_string(path) else { continue };
        let Ok(program) = gt_ir::text::parse(&src) else { continue };
        let mut it = Interpreter::new();
        for (instr, _) in program.instrs() {
            let type_of = |v| it.read(v).map(|t| t.ty).map_err(|_| TypeError::UnknownValue(v));
            if let Ok((prepared, types)) = checks::prepare(instr, &type_of, 1 << 30) {
                let ty = |v| it.read(v).expect("operands are defined").ty;
                let data = |v| it.read(v).expect("operands are defined").to_f32();
                let value = |v| {
                    let t = it.read(v).expect("operands are defined");
                    Value::from_elements(t.ty.shape.dims(), t.data)
                };
                for step in lower(&prepared, &ty, &types) {
                    let context = |e: String| format!("{}: {}: {e}", path.display(), instr.mnemonic());
                    // The JIT compiles f32 kernels without `round` nodes, and plain f64 and
                    // integer maps over buffers of their own types (what the fuse pass makes).
                    let f64_or_i64 = |k: &Kernel| matches!(k, Kernel::Map(m) if !m.is_plain_f32());
                    match step {
                        Step::Launch { kernel, inputs, output } if f64_or_i64(&kernel) => {
                            let values: Vec<Value> = inputs.iter().map(|&v| value(v)).collect();
                            let Some(buffers) = values.iter().map(Value::wide).collect::<Option<Vec<Wide>>>() else {
                                continue;
                            };
                            let t = &types[output];
                            let storage = BufferStorage {
                                output: Storage::of(t.dtype),
                                inputs: buffers.iter().map(Wide::storage).collect(),
                            };
                            if Jit::compiles_wide(&kernel, &storage) {
                                compare_wide(&mut jit, &kernel, &values, t).map_err(context).unwrap();
                                wide += 1;
                            }
                        }
                        Step::Launch { kernel, .. } | Step::TwoPass { first: kernel, .. } if f64_or_i64(&kernel) => {}
                        Step::Launch { kernel, inputs, output } => {
                            let buffers: Vec<Vec<f32>> = inputs.iter().map(|&v| data(v)).collect();
                            let refs: Vec<&[f32]> = buffers.iter().map(|b| &b[..]).collect();
                            let tol = tolerance(&kernel);
                            exact += usize::from(matches!(tol, Tol::Exact));
                            let len = types[output].shape.numel();
                            compare(&mut jit, &kernel, &refs, len, tol).map_err(context).unwrap();
                            kernels_checked += 1;
                        }
                        Step::TwoPass { first, inputs, partials, second, output } => {
                            let buffers: Vec<Vec<f32>> = inputs.iter().map(|&v| data(v)).collect();
                            let refs: Vec<&[f32]> = buffers.iter().map(|b| &b[..]).collect();
                            let temp =
                                compare(&mut jit, &first, &refs, partials, tolerance(&first)).map_err(context).unwrap();
                            let len = types[output].shape.numel();
                            compare(&mut jit, &second, &[&temp], len, tolerance(&second)).map_err(context).unwrap();
                            kernels_checked += 2;
                        }
                        Step::Upload { .. } => {}
                    }
                }
            }
            let _ = it.execute(instr);
        }
    }
    assert!(files.len() > 20, "found {} scripts", files.len());
    assert!(kernels_checked > 150 && exact > 50, "{kernels_checked} kernels checked, {exact} exactly");
    assert!(wide > 80, "{wide} f64 and integer kernels checked");
}

/// Runs an `f64` or integer `kernel` on the oracle and the JIT into a result of type `t`:
/// the first element whose bits differ (any NaN equals any NaN), if any.
fn compare_wide(jit: &mut Jit, kernel: &Kernel, inputs: &[Value], t: &gt_ir::TensorType) -> Result<(), String> {
    let dims = t.shape.dims();
    let refs: Vec<&Value> = inputs.iter().collect();
    // Elements a kernel does not write (a `concat` piece's) are zeros in the JIT's result.
    let mut want = Value::full(t.dtype, dims, 0.0);
    kernels::run_values(kernel, &refs, &mut want).map_err(|e| format!("oracle: {e}"))?;
    let buffers: Vec<Wide> = inputs.iter().map(|v| v.wide().expect("checked")).collect();
    let run = jit.run_wide(kernel, &buffers, Storage::of(t.dtype), t.shape.numel());
    let (got, _) = run.map_err(|e| e.to_string())?.ok_or("not compiled")?;
    let got = Value::from_elements(dims, got);
    let (want, got) = (want.to_elements(), got.to_elements());
    let same = match (&want, &got) {
        (Elements::F64(w), Elements::F64(g)) => {
            w.iter().zip(g).all(|(w, g)| w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()))
        }
        _ => want == got,
    };
    if same {
        Ok(())
    } else {
        Err(format!("oracle {want:?}\njit {got:?}\n{kernel}"))
    }
}

#[test]
fn sample_kernels_at_sizes_with_vector_tails() {
    let mut jit = jit();
    for n in [1, 3, 7, 33, 1000] {
        for dims in [vec![n], vec![3, n], vec![2, 2, n]] {
            let numel: usize = dims.iter().product();
            let x = values(n as u64, numel, -8.0, 8.0);
            check(&mut jit, &samples::softmax(&dims), &[&x], numel, Tol::Close { rel: 2e-6, abs: 1e-30 });
            check(&mut jit, &samples::layer_norm(&dims, 1e-5), &[&x], numel, Tol::Close { rel: 1e-5, abs: 1e-6 });
            // 1 + tanh cancels near -1: an absolute bound scaled by |x|.
            check(&mut jit, &samples::gelu(&dims), &[&x], numel, Tol::Close { rel: 2e-6, abs: 8e-7 });
        }
        for (m, k) in [(1, 1), (3, n), (n, 5)] {
            let (x, w, b) = (values(1, m * k, -1.0, 1.0), values(2, k * n, -1.0, 1.0), values(3, n, -1.0, 1.0));
            check(&mut jit, &samples::linear_relu(m, k, n), &[&x, &w, &b], m * n, Tol::Exact);
        }
    }
}

#[test]
fn strided_broadcast_and_backwards_accesses() {
    let mut jit = jit();
    let dims = [5, 9];
    let a = values(1, 45, -3.0, 3.0);
    let b = values(2, 9, -3.0, 3.0);
    let c = values(3, 45, -3.0, 3.0);
    use Node::*;
    let nodes = vec![
        Input(0),
        Input(1),
        Input(2),
        Binary(BinaryOp::Mul, 0, 1),
        Binary(BinaryOp::Sub, 3, 2),
        Unary(UnaryOp::Tanh, 4),
        Binary(BinaryOp::Maximum, 5, 0),
    ];
    let inputs = vec![
        // Transposed.
        Access { offset: 0, strides: vec![1, 5] },
        // Broadcast along the rows.
        Access { offset: 0, strides: vec![0, 1] },
        // Both axes backwards.
        Access { offset: 44, strides: vec![-9, -1] },
    ];
    let tol = Tol::Close { rel: 1e-6, abs: 0.0 };
    for output in [Access::contiguous(&dims), Access { offset: 0, strides: vec![1, 5] }] {
        let k = map(&dims, inputs.clone(), nodes.clone(), output);
        check(&mut jit, &k, &[&a, &b, &c], 45, tol);
    }
    // A strided window of a larger buffer, every other element, written with a gap.
    let big = values(4, 400, -3.0, 3.0);
    let k = map(
        &[3, 17],
        vec![Access { offset: 7, strides: vec![40, 2] }],
        vec![Input(0), Unary(UnaryOp::Exp, 0), Unary(UnaryOp::Neg, 1)],
        Access { offset: 1, strides: vec![20, 1] },
    );
    check(&mut jit, &k, &[&big], 80, tol);
    // A scalar broadcast everywhere and a constant-only kernel.
    let k = map(&[4, 6], vec![Access { offset: 3, strides: vec![0, 0] }], vec![Input(0)], Access::contiguous(&[4, 6]));
    check(&mut jit, &k, &[&b], 24, Tol::Exact);
    let k = map(&[13], vec![], vec![Node::constant(2.5), Unary(UnaryOp::Sqrt, 0)], Access::contiguous(&[13]));
    check(&mut jit, &k, &[], 13, Tol::Exact);
}

#[test]
fn creation_nodes_match_bit_for_bit() {
    let mut jit = jit();
    for dims in [vec![37], vec![3, 5, 7]] {
        let numel: usize = dims.iter().product();
        for node in [
            Node::Iota { start: (-2.5f64).to_bits(), step: 0.1f64.to_bits() },
            Node::Rand { seed: 7 },
            Node::Randn { seed: 8 },
        ] {
            let k = map(&dims, vec![], vec![node], Access::contiguous(&dims));
            check(&mut jit, &k, &[], numel, Tol::Exact);
        }
    }
}

#[test]
fn reductions_over_any_axes() {
    let mut jit = jit();
    let dims = [6, 9, 5];
    let x = values(9, 270, -4.0, 4.0);
    let tol = Tol::Close { rel: 1e-6, abs: 1e-9 };
    for rows in [vec![0], vec![1], vec![2], vec![0, 2], vec![0, 1, 2], vec![1, 2]] {
        let kept: Vec<usize> = (0..3).map(|a| if rows.contains(&a) { 1 } else { dims[a] }).collect();
        for op in ReduceOp::ALL {
            // A final reduction of exp(x) / 4.
            let k = Kernel::Map(MapKernel {
                shape: dims.to_vec(),
                inputs: vec![Access::contiguous(&dims)],
                nodes: vec![
                    Node::Input(0),
                    Node::Unary(UnaryOp::Exp, 0),
                    Node::constant(0.25),
                    Node::Binary(BinaryOp::Mul, 1, 2),
                ],
                output: Access::contiguous(&kept),
                rows: rows.clone(),
                reduce: Some(*op),
                compute: Compute::F32,
            });
            check(&mut jit, &k, &[&x], kept.iter().product(), tol);
            // A mid-expression reduction: x - op(x) over the row, written everywhere.
            let k = Kernel::Map(MapKernel {
                shape: dims.to_vec(),
                inputs: vec![Access::contiguous(&dims)],
                nodes: vec![Node::Input(0), Node::Reduce(*op, 0), Node::Binary(BinaryOp::Sub, 0, 1)],
                output: Access::contiguous(&dims),
                rows: rows.clone(),
                reduce: None,
                compute: Compute::F32,
            });
            check(&mut jit, &k, &[&x], 270, tol);
        }
    }
    // A reduction of a reduction, and a transposed input.
    let k = Kernel::Map(MapKernel {
        shape: vec![7, 11],
        inputs: vec![Access { offset: 0, strides: vec![1, 7] }],
        nodes: vec![
            Node::Input(0),
            Node::Reduce(ReduceOp::Max, 0),
            Node::Binary(BinaryOp::Sub, 0, 1),
            Node::Reduce(ReduceOp::Mean, 2),
            Node::Binary(BinaryOp::Mul, 3, 1),
            Node::Binary(BinaryOp::Add, 4, 0),
        ],
        output: Access::contiguous(&[7, 11]),
        rows: vec![1],
        reduce: Some(ReduceOp::Sum),
        compute: Compute::F32,
    });
    let k = match k {
        Kernel::Map(mut m) => {
            m.output = Access { offset: 0, strides: vec![1, 0] };
            Kernel::Map(m)
        }
        k => k,
    };
    check(&mut jit, &k, &[&x[..77]], 7, tol);
}

/// `op` over each row of a contiguous `rows x len` input.
fn row_reduction(rows: usize, len: usize, op: ReduceOp) -> Kernel {
    Kernel::Map(MapKernel {
        shape: vec![rows, len],
        inputs: vec![Access::contiguous(&[rows, len])],
        nodes: vec![Node::Input(0)],
        output: Access::contiguous(&[rows, 1]),
        rows: vec![1],
        reduce: Some(op),
        compute: Compute::F32,
    })
}

#[test]
fn sums_whose_order_matters_give_the_oracles_bits() {
    // Magnitudes far apart, so that f64 sums in another order round differently: the
    // interpreter sums a contiguous row in the JIT's lanes, and both give the same bits.
    let big = 2f32.powi(60);
    let pattern = [big, 200.0, -big, 200.0, 7.0, -big / 2.0, 1e-3, big / 2.0, -1.0];
    let mut jit = jit();
    for len in (0..=13).chain([37, 100]) {
        let x: Vec<f32> = (0..3 * len).map(|i| pattern[i % pattern.len()] * (1.0 + (i / 9) as f32)).collect();
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            check(&mut jit, &row_reduction(3, len, op), &[&x], 3, Tol::Exact);
        }
    }
    // The order does matter here: one chain from the left gives other bits for some row.
    let x: Vec<f32> = (0..100).map(|i| pattern[i % 4]).collect();
    let chain = x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
    let mut lanes = [0.0f32];
    jit.run(&row_reduction(1, 100, ReduceOp::Sum), &[&x], &mut lanes).unwrap();
    assert_ne!(chain.to_bits(), lanes[0].to_bits(), "the pattern does not tell the orders apart");
}

#[test]
fn empty_shapes_and_empty_rows() {
    let mut jit = jit();
    for op in ReduceOp::ALL {
        let k = row_reduction(4, 0, *op);
        let want = check_values(&mut jit, &k, &[&[]], 4);
        let expected = match op {
            ReduceOp::Sum => -0.0,
            ReduceOp::Mean => f32::NAN,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        };
        assert!(want.iter().all(|&w| agrees(expected, w, Tol::Exact)), "{op:?}: {want:?}");
    }
    // Nothing to iterate: nothing written, nothing read (the buffers are empty).
    for dims in [vec![0], vec![3, 0, 2], vec![0, 5]] {
        let k = map(
            &dims,
            vec![Access::contiguous(&dims)],
            vec![Node::Input(0), Node::Unary(UnaryOp::Exp, 0)],
            Access::contiguous(&dims),
        );
        check(&mut jit, &k, &[&[]], 0, Tol::Exact);
    }
    let k = samples::softmax(&[0, 8]);
    check(&mut jit, &k, &[&[]], 0, Tol::Exact);
}

fn check_values(jit: &mut Jit, kernel: &Kernel, inputs: &[&[f32]], len: usize) -> Vec<f32> {
    let mut got = vec![UNWRITTEN; len];
    jit.run(kernel, inputs, &mut got).unwrap();
    let want = compare(jit, kernel, inputs, len, Tol::Exact).unwrap();
    assert!(want.iter().zip(&got).all(|(&w, &g)| agrees(w, g, Tol::Exact)));
    got
}

/// Special values and neighbours of every threshold the approximations switch at.
fn special_values() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE / 2.0,
        1e-45,
        -1e-45,
        1e-30,
        f32::MAX,
        f32::MIN,
        f32::EPSILON,
        0.625,
        -0.625,
        0.624_999_94,
        88.72,
        88.73,
        89.0,
        -87.3,
        -103.0,
        -103.97,
        -104.0,
        -110.0,
        1e10,
        -1e10,
        std::f32::consts::FRAC_1_SQRT_2,
        f32::from_bits(std::f32::consts::FRAC_1_SQRT_2.to_bits() - 1),
        0.999_999_9,
        1.000_000_1,
    ];
    v.extend((0..64).map(|i| i as f32 * 0.37 - 12.0));
    v
}

#[test]
fn every_op_on_special_values() {
    let mut jit = jit();
    let x = special_values();
    let n = x.len();
    // All pairs for binary ops, through two broadcast inputs.
    let a: Vec<f32> = x.iter().flat_map(|&v| std::iter::repeat_n(v, n)).collect();
    let b: Vec<f32> = x.iter().copied().cycle().take(n * n).collect();
    let close = Tol::Close { rel: 5e-7, abs: 1e-44 };
    for op in UnaryOp::ALL {
        let k = map(
            &[n],
            vec![Access::contiguous(&[n])],
            vec![Node::Input(0), Node::Unary(*op, 0)],
            Access::contiguous(&[n]),
        );
        let tol = if is_transcendental(&[Node::Unary(*op, 0)]) { close } else { Tol::Exact };
        check(&mut jit, &k, &[&x], n, tol);
    }
    for op in BinaryOp::ALL {
        let k = map(
            &[n, n],
            vec![Access { offset: 0, strides: vec![1, 0] }, Access { offset: 0, strides: vec![0, 1] }],
            vec![Node::Input(0), Node::Input(1), Node::Binary(*op, 0, 1)],
            Access::contiguous(&[n, n]),
        );
        check(&mut jit, &k, &[&x, &x], n * n, Tol::Exact);
        let k = map(
            &[n * n],
            vec![Access::contiguous(&[n * n]); 2],
            vec![Node::Input(0), Node::Input(1), Node::Binary(*op, 0, 1)],
            Access::contiguous(&[n * n]),
        );
        check(&mut jit, &k, &[&a, &b], n * n, Tol::Exact);
    }
    let k = map(
        &[n * n],
        vec![Access::contiguous(&[n * n]); 2],
        vec![Node::Input(0), Node::Input(1), Node::Unary(UnaryOp::Neg, 1), Node::Select(0, 1, 2)],
        Access::contiguous(&[n * n]),
    );
    check(&mut jit, &k, &[&a, &b], n * n, Tol::Exact);
    // NaN-propagating max/min reductions.
    for op in [ReduceOp::Max, ReduceOp::Min] {
        check(&mut jit, &row_reduction(n, n, op), &[&b], n, Tol::Close { rel: 0.0, abs: 0.0 });
    }
}

/// Largest error in ulp of `f` (unary op `op`) against the oracle over `xs`, finite results.
fn max_ulp(jit: &mut Jit, op: UnaryOp, xs: &[f32]) -> f64 {
    let n = xs.len();
    let k =
        map(&[n], vec![Access::contiguous(&[n])], vec![Node::Input(0), Node::Unary(op, 0)], Access::contiguous(&[n]));
    let mut want = vec![0.0; n];
    kernels::run(&k, &[xs], &mut want).unwrap();
    let mut got = vec![0.0; n];
    jit.run(&k, &[xs], &mut got).unwrap();
    let mut worst = 0.0f64;
    for ((&x, &w), &g) in xs.iter().zip(&want).zip(&got) {
        let same_class = if w.is_nan() { g.is_nan() } else { w.is_finite() || w == g };
        assert!(same_class, "{op:?}({x:e}): oracle {w:e}, jit {g:e}");
        if w.is_finite() && w.abs() >= f32::MIN_POSITIVE {
            let ulp = (w.abs().next_up() - w.abs()) as f64;
            worst = worst.max(f64::from((w - g).abs()) / ulp);
        } else if w.is_finite() {
            // Subnormal results: within one subnormal step (plus the relative error).
            assert!((w - g).abs() <= 2e-45 + 1e-6 * w.abs(), "{op:?}({x:e}): oracle {w:e}, jit {g:e}");
        }
    }
    worst
}

#[test]
fn transcendental_functions_are_accurate_over_wide_ranges() {
    let mut jit = jit();
    let mut xs = special_values();
    xs.extend(values(1, 20_000, -20.0, 20.0));
    xs.extend(values(2, 20_000, -110.0, 90.0));
    xs.extend(values(3, 10_000, -1.0, 1.0));
    // Log-uniform magnitudes over the whole positive range, subnormals included.
    xs.extend((0..20_000u64).map(|i| f32::from_bits(1 + (random::uniform(4, i) * 2_139_095_039.0) as u32)));
    for op in [UnaryOp::Exp, UnaryOp::Log, UnaryOp::Tanh, UnaryOp::Sigmoid] {
        let ulp = max_ulp(&mut jit, op, &xs);
        println!("{op:?}: max error {ulp} ulp over {} values", xs.len());
        assert!(ulp <= 2.0, "{op:?}: {ulp} ulp");
    }
    // `erf`'s rational approximation: a few ulp near +-1 (absolute error < 5e-7).
    let ulp = max_ulp(&mut jit, UnaryOp::Erf, &xs);
    println!("Erf: max error {ulp} ulp over {} values", xs.len());
    assert!(ulp <= 8.0, "Erf: {ulp} ulp");
    // Never beyond +-1, where the fit overshoots (|x| near 4): `pow(erf x, erf x)` was NaN.
    let near_four: Vec<f32> = (0..100_000).map(|i| 3.0 + i as f32 * 1e-4).flat_map(|x| [x, -x]).collect();
    let compiled = jit_unary(&mut jit, UnaryOp::Erf, &near_four);
    for (i, &x) in near_four.iter().enumerate() {
        for (how, e) in [
            ("compiled", compiled[i]),
            ("vmath", crate::backend::cpu::vmath::erf::<true>(x)),
            ("baseline", crate::backend::cpu::vmath::erf::<false>(x)),
        ] {
            assert!(e.abs() <= 1.0, "erf({x}) = {e} ({how})");
        }
    }
}

#[test]
fn matmuls_with_batches_strides_and_epilogues() {
    let mut jit = jit();
    use Node::*;
    // Batch [2, 3] with the lhs broadcast over the first batch axis and the rhs transposed.
    let (m, n, k) = (5, 6, 7);
    let lhs = values(1, 3 * m * k, -1.0, 1.0);
    let rhs = values(2, 2 * 3 * n * k, -1.0, 1.0);
    let bias = values(3, m, -1.0, 1.0);
    let kernel = Kernel::MatMul(MatMulKernel {
        batch: vec![2, 3],
        m,
        n,
        k,
        lhs: Access { offset: 0, strides: vec![0, (m * k) as i64, k as i64, 1] },
        rhs: Access { offset: 0, strides: vec![(3 * n * k) as i64, (n * k) as i64, 1, k as i64] },
        epilogue: vec![Acc, Input(0), Binary(BinaryOp::Mul, 0, 1), Unary(UnaryOp::Tanh, 2)],
        epilogue_inputs: vec![Access { offset: 0, strides: vec![0, 0, 1, 0] }],
        precision: Default::default(),
    });
    check(&mut jit, &kernel, &[&lhs, &rhs, &bias], 6 * m * n, Tol::Close { rel: 2e-6, abs: 1e-30 });
    // No epilogue; k == 0; m == 0.
    let Kernel::MatMul(base) = kernel else { unreachable!() };
    let plain = MatMulKernel { epilogue: vec![], epilogue_inputs: vec![], ..base.clone() };
    check(&mut jit, &Kernel::MatMul(plain), &[&lhs, &rhs], 6 * m * n, Tol::Exact);
    let empty_k = MatMulKernel {
        k: 0,
        epilogue: vec![Acc, Node::constant(1.0), Binary(BinaryOp::Add, 0, 1)],
        epilogue_inputs: vec![],
        ..base.clone()
    };
    check(&mut jit, &Kernel::MatMul(empty_k), &[&[], &[]], 6 * m * n, Tol::Exact);
    let empty_m = MatMulKernel { m: 0, epilogue_inputs: vec![], epilogue: vec![], ..base };
    check(&mut jit, &Kernel::MatMul(empty_m), &[&[], &rhs], 0, Tol::Exact);
}

#[test]
fn the_cache_compiles_each_kernel_once() {
    let mut jit = jit();
    let k = samples::softmax(&[4, 33]);
    let x = values(1, 132, -1.0, 1.0);
    let mut out = vec![0.0; 132];
    assert!(jit.compile(&k).unwrap() > Duration::ZERO);
    for _ in 0..3 {
        jit.run(&k, &[&x], &mut out).unwrap();
    }
    assert_eq!(jit.compile(&k).unwrap(), Duration::ZERO);
    let s = jit.stats();
    assert_eq!((s.compiled, s.cache_hits), (1, 4));
    // Another shape is another kernel.
    jit.run(&samples::softmax(&[4, 34]), &[&values(1, 136, -1.0, 1.0)], &mut vec![0.0; 136]).unwrap();
    assert_eq!(jit.stats().compiled, 2);
    assert!(jit.stats().compile_time > Duration::ZERO);
}

#[test]
fn bad_kernels_and_buffers_are_errors() {
    let mut jit = jit();
    let k = samples::softmax(&[4, 8]);
    let mut out = vec![0.0; 32];
    let e = jit.run(&k, &[&[0.0; 31]], &mut out).unwrap_err();
    assert!(matches!(e, JitError::Bounds(KernelError::OutOfBounds { buffer: Buffer::Input(0), .. })), "{e}");
    assert!(e.to_string().contains("input 0"), "{e}");
    let e = jit.run(&k, &[&[0.0; 32]], &mut out[..31]).unwrap_err();
    assert!(matches!(e, JitError::Bounds(KernelError::OutOfBounds { buffer: Buffer::Output, .. })), "{e}");
    let e = jit.run(&k, &[], &mut out).unwrap_err();
    assert!(matches!(e, JitError::Bounds(KernelError::InputCount { expected: 1, given: 0 })), "{e}");
    let Kernel::Map(mut bad) = k.clone() else { unreachable!() };
    bad.nodes.push(Node::Input(3));
    let bad = Kernel::Map(bad);
    let input = |e: &KernelError| matches!(e, KernelError::InputOutOfRange { input: 3, inputs: 1, .. });
    assert!(matches!(jit.run(&bad, &[&[0.0; 32]], &mut out), Err(JitError::Bounds(e)) if input(&e)));
    assert!(matches!(jit.compile(&bad), Err(JitError::Invalid(e)) if input(&e)));
    assert!(clif(&bad).is_err());
    let Kernel::Map(mut empty) = k else { unreachable!() };
    empty.nodes.clear();
    assert!(matches!(jit.compile(&Kernel::Map(empty)), Err(JitError::Invalid(KernelError::NoNodes))));
    assert_eq!(jit.stats().compiled, 0);
    // Absurd sizes compile (or are refused) without panicking, and never run.
    let absurd = map(
        &[usize::MAX, 3, usize::MAX / 2],
        vec![Access { offset: i64::MAX, strides: vec![i64::MAX, i64::MIN, 1] }],
        vec![Node::Input(0), Node::Unary(UnaryOp::Exp, 0)],
        Access { offset: 0, strides: vec![i64::MIN, 1, i64::MAX] },
    );
    let _ = jit.compile(&absurd);
    assert!(matches!(jit.run(&absurd, &[&[1.0]], &mut out), Err(JitError::Bounds(_))));
}

#[test]
fn clif_is_deterministic_and_vectorised() {
    let k = samples::softmax(&[4, 33]);
    let text = clif(&k).unwrap();
    assert_eq!(text, clif(&k).unwrap());
    assert!(text.contains("f32x4") && text.contains("f64x2"), "{text}");
    let mm = clif(&samples::linear_relu(3, 4, 5)).unwrap();
    assert!(mm.starts_with("; matmul") && mm.contains("function %epilogue"), "{mm}");
    let strided = map(
        &[3, 5],
        vec![Access { offset: 0, strides: vec![1, 3] }],
        vec![Node::Input(0)],
        Access::contiguous(&[3, 5]),
    );
    assert!(!clif(&strided).unwrap().contains("f32x4"));
    // A cheap map's main loop stores four vectors per iteration, then come a single-vector
    // loop and the scalar tail (one store each); a map with a costly op stores one vector
    // per iteration, then its scalar tail.
    let stores = |nodes: Vec<Node>| {
        let k = map(&[1003], vec![Access::contiguous(&[1003])], nodes, Access::contiguous(&[1003]));
        clif(&k).unwrap().lines().filter(|l| l.contains("store notrap")).count()
    };
    let cheap = stores(vec![Node::Input(0), Node::constant(0.5), Node::Binary(BinaryOp::Mul, 0, 1)]);
    let costly = stores(vec![Node::Input(0), Node::Unary(UnaryOp::Tanh, 0)]);
    assert_eq!((cheap, costly), (6, 2));
}

/// Runs `kernel` on fresh JITs with and without the final pass reusing a value of the last
/// reduction pass; both must give the same bits (any NaN for NaN: which NaN an op on two
/// NaNs returns depends on operand order in the machine code), and match the oracle. The
/// node reused.
fn check_reuse(kernel: &Kernel, inputs: &[&[f32]], len: usize) -> Option<usize> {
    let Kernel::Map(k) = kernel else { panic!("a map kernel") };
    let reused = codegen::reused_node(k);
    let run = |no_reuse: bool| {
        codegen::NO_REUSE.with(|c| c.set(no_reuse));
        let mut got = vec![UNWRITTEN; len];
        let result = jit().run(kernel, inputs, &mut got);
        codegen::NO_REUSE.with(|c| c.set(false));
        result.expect("the kernel runs");
        got
    };
    let (before, after) = (run(true), run(false));
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(agrees(*b, *a, Tol::Exact), "element {i}: {b:e} recomputed, {a:e} reused\n{kernel}");
    }
    check(&mut jit(), kernel, inputs, len, tolerance(kernel));
    reused
}

fn row_map(shape: &[usize], rows: Vec<usize>, inputs: Vec<Access>, nodes: Vec<Node>, output: Access) -> Kernel {
    Kernel::Map(MapKernel { shape: shape.to_vec(), inputs, nodes, output, rows, reduce: None, compute: Compute::F32 })
}

#[test]
fn final_passes_reuse_the_costliest_value_of_the_last_reduction_pass() {
    use Node::*;
    // Softmax reuses `e = exp(x - max)` (node 3); layer norm has nothing costly to reuse.
    for dims in [vec![3, 33], vec![2, 1000], vec![5, 7], vec![4, 3], vec![1000], vec![2, 3, 9]] {
        let numel: usize = dims.iter().product();
        let x = values(numel as u64, numel, -30.0, 30.0);
        assert_eq!(check_reuse(&samples::softmax(&dims), &[&x], numel), Some(3), "{dims:?}");
        assert_eq!(check_reuse(&samples::layer_norm(&dims, 1e-5), &[&x], numel), None, "{dims:?}");
    }
    let softmax_nodes = samples::softmax(&[1]);
    let Kernel::Map(MapKernel { nodes: softmax_nodes, .. }) = softmax_nodes else { unreachable!() };
    // The row axis is not the last: a strided (scalar) row, contiguous output.
    let x = values(7, 33 * 5, -10.0, 10.0);
    let c = Access::contiguous(&[33, 5]);
    let k = row_map(&[33, 5], vec![0], vec![c.clone()], softmax_nodes.clone(), c.clone());
    assert_eq!(check_reuse(&k, &[&x], 33 * 5), Some(3));
    // Written transposed and backwards along the row: still one element per point.
    let back = Access { offset: 32, strides: vec![-1, 33] };
    let k = row_map(&[33, 5], vec![0], vec![c.clone()], softmax_nodes.clone(), back);
    assert_eq!(check_reuse(&k, &[&x], 33 * 5), Some(3));
    // Every point of a row writes one element: nothing may be kept there.
    let same = Access { offset: 0, strides: vec![0, 1] };
    let k = row_map(&[33, 5], vec![0], vec![c.clone()], softmax_nodes.clone(), same);
    assert_eq!(check_reuse(&k, &[&x], 5), None);
    // A contiguous input with a strided output: the sum pass is vectorised, the final pass
    // is not, so their values could come from different code: not reused.
    let x = values(8, 3 * 40, -10.0, 10.0);
    let spread = Access { offset: 0, strides: vec![80, 2] };
    let k = row_map(&[3, 40], vec![1], vec![Access::contiguous(&[3, 40])], softmax_nodes, spread);
    assert_eq!(check_reuse(&k, &[&x], 3 * 80), None);
    // The best of several candidates: `e` (node 3) saves the exp; `f = e * y` (node 5) saves
    // nothing, as the final pass needs `e` itself too. A broadcast second input.
    let nodes = vec![
        Input(0),
        Reduce(ReduceOp::Max, 0),
        Binary(BinaryOp::Sub, 0, 1),
        Unary(UnaryOp::Exp, 2),
        Input(1),
        Binary(BinaryOp::Mul, 3, 4),
        Reduce(ReduceOp::Sum, 5),
        Binary(BinaryOp::Div, 5, 6),
        Binary(BinaryOp::Add, 7, 3),
    ];
    for n in [3, 4, 37] {
        let dims = [2, n];
        let (x, y) = (values(9, 2 * n, -5.0, 5.0), values(10, n, 0.5, 2.0));
        let inputs = vec![Access::contiguous(&dims), Access { offset: 0, strides: vec![0, 1] }];
        let k = row_map(&dims, vec![1], inputs, nodes.clone(), Access::contiguous(&dims));
        assert_eq!(check_reuse(&k, &[&x, &y], 2 * n), Some(3), "{n}");
    }
}

#[test]
fn softmax_computes_exp_once_per_element() {
    // `exp` (one `sshr` each, for `2^(n/2)`) in the sum pass's vector loop and tail; the
    // final pass loads it back from the output instead of emitting it twice more.
    let k = samples::softmax(&[4, 33]);
    let exps = |text: &str| text.lines().filter(|l| l.contains(" = sshr ")).count();
    assert_eq!(exps(&clif(&k).unwrap()), 2);
    codegen::NO_REUSE.with(|c| c.set(true));
    let before = clif(&k);
    codegen::NO_REUSE.with(|c| c.set(false));
    assert_eq!(exps(&before.unwrap()), 4);
}

#[test]
fn jit_is_send() {
    fn send<T: Send>() {}
    send::<Jit>();
}

/// A random kernel: `shape`, inputs as (buffer, access), nodes.
#[derive(Debug, Clone)]
struct Case {
    shape: Vec<usize>,
    inputs: Vec<(Vec<f32>, Access)>,
    nodes: Vec<Node>,
    output: Access,
    out_len: usize,
    rows: Vec<usize>,
    reduce: Option<ReduceOp>,
}

/// An access over `shape` of a buffer holding the non-broadcast axes in the order `perm`,
/// axes with `flip` walked backwards.
fn layout(shape: &[usize], broadcast: &[bool], perm: &[usize], flip: &[bool]) -> (usize, Access) {
    let dims: Vec<usize> = shape.iter().zip(broadcast).map(|(&d, &b)| if b { 1 } else { d }).collect();
    let mut strides = vec![0i64; shape.len()];
    let mut step = 1i64;
    for &a in perm.iter().rev() {
        strides[a] = if dims[a] == 1 { 0 } else { step };
        step *= dims[a] as i64;
    }
    let mut offset = 0i64;
    for a in 0..shape.len() {
        if flip[a] && dims[a] > 1 {
            offset += strides[a] * (dims[a] as i64 - 1);
            strides[a] = -strides[a];
        }
    }
    (dims.iter().product(), Access { offset, strides })
}

const POOL: [f32; 12] = [0.5, -1.5, 2.0, -3.0, 7.0, 0.25, -0.75, 1.0, f32::NAN, f32::INFINITY, 4.5, -2.5];

fn case(transcendental: bool) -> impl Strategy<Value = Case> {
    // Axes of 15 to 35 reach a cheap pass's unrolled loop (16 elements an iteration) and
    // its single-vector and scalar tails.
    let shape = prop::collection::vec(prop_oneof![2 => 0usize..10, 1 => Just(1usize), 1 => 15usize..36], 1..=3);
    (shape, any::<u64>(), prop::collection::vec(any::<(u8, u32, u32, u32)>(), 1..14), any::<(u8, u8, bool)>()).prop_map(
        move |(shape, seed, ops, (rowbits, reduce, transposed))| {
            let rank = shape.len();
            let mut rng = seed;
            let mut next = move || {
                rng = random::splitmix64(rng);
                rng
            };
            let n_inputs = 1 + (next() % 3) as usize;
            let inputs = (0..n_inputs)
                .map(|i| {
                    let broadcast: Vec<bool> = (0..rank).map(|_| next() % 3 == 0).collect();
                    let mut perm: Vec<usize> = (0..rank).collect();
                    if next() % 2 == 0 {
                        perm.reverse();
                    }
                    let flip: Vec<bool> = (0..rank).map(|_| next() % 4 == 0).collect();
                    let (len, access) = layout(&shape, &broadcast, &perm, &flip);
                    let data = (0..len)
                        .map(|j| {
                            let r = next();
                            if transcendental {
                                random::uniform(r, j as u64) * 6.0 - 3.0
                            } else {
                                POOL[(r % POOL.len() as u64) as usize] * if i == 0 { 1.0 } else { 0.5 }
                            }
                        })
                        .collect();
                    (data, access)
                })
                .collect::<Vec<_>>();
            let rows: Vec<usize> =
                if transcendental { vec![] } else { (0..rank).filter(|a| rowbits >> a & 1 == 1).collect() };
            let mut nodes: Vec<Node> = (0..n_inputs as u32).map(Node::Input).collect();
            for (kind, a, b, c) in ops {
                let len = nodes.len() as u32;
                let (a, b, c) = (a % len, b % len, c % len);
                let node = if transcendental {
                    let unary =
                        [UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu];
                    let binary = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Maximum, BinaryOp::Minimum];
                    match kind % 3 {
                        0 => Node::Unary(unary[(kind / 3) as usize % unary.len()], a),
                        1 => Node::Binary(binary[(kind / 3) as usize % binary.len()], a, b),
                        _ => Node::constant(POOL[(kind / 3) as usize % 8]),
                    }
                } else {
                    let unary = [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Sqrt, UnaryOp::Rsqrt];
                    match kind % 6 {
                        0 => Node::Unary(unary[(kind / 6) as usize % unary.len()], a),
                        1 | 2 => Node::Binary(BinaryOp::ALL[(kind / 6) as usize % BinaryOp::ALL.len()], a, b),
                        3 => Node::Select(a, b, c),
                        4 if !rows.is_empty() => Node::Reduce(ReduceOp::ALL[(kind / 6) as usize % 4], a),
                        _ => Node::constant(POOL[(kind / 6) as usize % POOL.len()]),
                    }
                };
                nodes.push(node);
            }
            let reduce = (!rows.is_empty() && reduce % 2 == 0).then(|| ReduceOp::ALL[(reduce / 2) as usize % 4]);
            let out_dims: Vec<usize> = shape
                .iter()
                .enumerate()
                .map(|(a, &d)| if reduce.is_some() && rows.contains(&a) { 1 } else { d })
                .collect();
            let perm: Vec<usize> = if transposed { (0..rank).rev().collect() } else { (0..rank).collect() };
            let (out_len, output) = layout(&out_dims, &vec![false; rank], &perm, &vec![false; rank]);
            Case { shape, inputs, nodes, output, out_len, rows, reduce }
        },
    )
}

fn run_case(c: &Case, tol: Tol) -> Result<(), TestCaseError> {
    let kernel = Kernel::Map(MapKernel {
        shape: c.shape.clone(),
        inputs: c.inputs.iter().map(|(_, a)| a.clone()).collect(),
        nodes: c.nodes.clone(),
        output: c.output.clone(),
        rows: c.rows.clone(),
        reduce: c.reduce,
        compute: Compute::F32,
    });
    let refs: Vec<&[f32]> = c.inputs.iter().map(|(d, _)| &d[..]).collect();
    let mut jit = jit();
    compare(&mut jit, &kernel, &refs, c.out_len, tol).map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Exact ops (and row reductions, which accumulate in f64 like the oracle) over random
    /// broadcasting, transposed and backwards layouts: the oracle's bits.
    #[test]
    fn random_exact_dags_match_the_oracle(c in case(false)) {
        run_case(&c, Tol::Close { rel: 0.0, abs: 0.0 })?;
    }

    /// Row maps whose final pass loads a value the last reduction pass stored in the output
    /// give the bits they give recomputing it: random DAGs ending in `t = last / x`,
    /// `t + sum(t)`.
    #[test]
    fn reusing_values_of_the_last_reduction_pass_changes_no_bits(c in case(false)) {
        prop_assume!(!c.rows.is_empty() && c.reduce.is_none());
        let last = c.nodes.len() as u32 - 1;
        let mut nodes = c.nodes.clone();
        nodes.extend([
            Node::Binary(BinaryOp::Div, last, 0),
            Node::Reduce(ReduceOp::Sum, last + 1),
            Node::Binary(BinaryOp::Add, last + 1, last + 2),
        ]);
        let kernel = Kernel::Map(MapKernel {
            shape: c.shape.clone(),
            inputs: c.inputs.iter().map(|(_, a)| a.clone()).collect(),
            nodes,
            output: c.output.clone(),
            rows: c.rows.clone(),
            reduce: None,
            compute: Compute::F32,
        });
        let refs: Vec<&[f32]> = c.inputs.iter().map(|(d, _)| &d[..]).collect();
        check_reuse(&kernel, &refs, c.out_len);
    }

    /// With `exp`/`tanh`/`sigmoid` in the chain: within a loose bound (errors compound).
    #[test]
    fn random_transcendental_dags_match_the_oracle(c in case(true)) {
        run_case(&c, Tol::Close { rel: 1e-4, abs: 1e-5 })?;
    }
}

/// The compile cache is bounded and evicts what was not used: past
/// [`MAX_CACHED_KERNELS`] distinct kernels the oldest generation's code is freed, while a
/// kernel in use all along stays compiled (compiled again once per generation, never
/// evicted), and every kernel still computes what the oracle does.
#[test]
fn the_compile_cache_is_bounded_and_keeps_the_kernels_in_use() {
    let mut jit = jit();
    let x = values(1, 8, -2.0, 2.0);
    let scale = |c: usize| {
        let nodes = vec![Node::Input(0), Node::constant(c as f32), Node::Binary(BinaryOp::Mul, 0, 1)];
        map(&[8], vec![Access::contiguous(&[8])], nodes, Access::contiguous(&[8]))
    };
    let (hot, distinct) = (scale(usize::MAX), 2 * super::MAX_CACHED_KERNELS + 10);
    let run = |jit: &mut super::Jit, k: &Kernel, c: f32| {
        let mut out = vec![0.0; 8];
        jit.run(k, &[&x], &mut out).unwrap();
        assert_eq!(out, x.iter().map(|v| v * c).collect::<Vec<_>>(), "kernel {c}");
    };
    for c in 0..distinct {
        run(&mut jit, &scale(c), c as f32);
        run(&mut jit, &hot, usize::MAX as f32);
    }
    let s = jit.stats();
    // A generation holds 2048 kernels, the hot one among them: 8202 distinct kernels and
    // the hot one fill four and start a fifth. Starting the third, fourth and fifth freed
    // the first three.
    let generations = 5;
    assert_eq!(s.evictions, generations - 2, "{s:?}");
    assert!(s.cached as usize <= super::MAX_CACHED_KERNELS, "{s:?}");
    assert!(s.code_bytes > 0 && (s.code_bytes as usize) < super::MAX_CODE_BYTES, "{s:?}");
    // Every distinct kernel once, the hot one once per generation; every run of the hot
    // one but its first found it.
    assert_eq!(s.compiled, distinct as u64 + generations, "{s:?}");
    assert_eq!(s.cache_hits, distinct as u64 - 1, "{s:?}");
}

/// On a worker with compute threads, a large map kernel runs as ranges of its outer axis
/// in parallel; elementwise, row (softmax, layer norm) and reduction kernels give the same
/// bits as run whole, and kernels numbering their elements (randn) are not split.
#[test]
fn kernels_split_over_threads_give_the_same_bits() {
    use crate::backend::cpu::threads::use_threads;
    let dims = [1500, 700];
    let n = dims[0] * dims[1];
    let x = values(7, n, -4.0, 4.0);
    let kernels = [
        samples::gelu(&dims),
        samples::softmax(&dims),
        samples::layer_norm(&dims, 1e-5),
        map(&dims, vec![], vec![Node::Randn { seed: 3 }], Access::contiguous(&dims)),
    ];
    for k in &kernels {
        let Kernel::Map(m) = k else { unreachable!("samples are maps") };
        let inputs: Vec<&[f32]> = m.inputs.iter().map(|_| &x[..]).collect();
        let run = |threads| {
            use_threads(threads, std::time::Duration::ZERO).unwrap();
            let mut out = vec![0f32; n];
            jit().run(k, &inputs, &mut out).unwrap();
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let (alone, split) = (run(1), run(2));
        assert!(alone == split, "{}", k.kind());
        let randn = m.nodes.iter().any(|n| matches!(n, Node::Randn { .. }));
        use_threads(2, std::time::Duration::ZERO).unwrap();
        assert_eq!(super::split_outer(m).len(), if randn { 1 } else { 2 }, "{}", k.kind());
        use_threads(1, std::time::Duration::ZERO).unwrap();
    }
}

/// A split kernel whose parts fill the cache as they compile (the second part starts a new
/// generation) runs with the same bits as run whole, each part's code found once per run,
/// and runs again from the cache.
#[test]
fn a_split_kernel_whose_parts_fill_the_cache_gives_the_same_bits() {
    use crate::backend::cpu::threads::use_threads;
    let dims = [300, 256];
    let n = dims[0] * dims[1];
    let x = values(11, n, -4.0, 4.0);
    let big = samples::gelu(&dims);
    let whole = |jit: &mut Jit| {
        let mut out = vec![0f32; n];
        jit.run(&big, &[&x], &mut out).unwrap();
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    use_threads(1, std::time::Duration::ZERO).unwrap();
    let alone = whole(&mut jit());
    use_threads(2, std::time::Duration::ZERO).unwrap();
    let mut jit = jit();
    let small = values(12, 8, -1.0, 1.0);
    for c in 0..super::MAX_CACHED_KERNELS / 2 - 1 {
        let nodes = vec![Node::Input(0), Node::constant(c as f32), Node::Binary(BinaryOp::Add, 0, 1)];
        let k = map(&[8], vec![Access::contiguous(&[8])], nodes, Access::contiguous(&[8]));
        jit.run(&k, &[&small], &mut [0f32; 8]).unwrap();
    }
    let split = whole(&mut jit);
    let first = jit.stats();
    let again = whole(&mut jit);
    let second = jit.stats();
    let thrice = whole(&mut jit);
    let third = jit.stats();
    use_threads(1, std::time::Duration::ZERO).unwrap();
    assert!(alone == split && split == again && again == thrice);
    // Both parts compiled, the generation filling between them. Then both found, the first
    // (in the generation before) compiled again into the current one; then both found.
    assert_eq!((first.compiled, first.cache_hits), ((super::MAX_CACHED_KERNELS / 2 - 1) as u64 + 2, 0), "{first:?}");
    assert_eq!((second.compiled, second.cache_hits), (first.compiled + 1, 2), "{second:?}");
    assert_eq!((third.compiled, third.cache_hits), (second.compiled, 4), "{third:?}");
}

/// A large product's epilogue runs as ranges of the product's rows on the worker's threads,
/// with the same bits as run whole (as the product itself does).
#[test]
fn a_large_products_epilogue_splits_over_threads_with_the_same_bits() {
    use crate::backend::cpu::threads::use_threads;
    use Node::*;
    let (m, n, k) = (784, 256, 16);
    let (lhs, rhs, w) = (values(1, m * k, -1.0, 1.0), values(2, k * n, -1.0, 1.0), values(3, m * n, -1.0, 1.0));
    // An SGD update of `w` by the product, as the fuse pass makes one: `w - 0.01 * (x @ g)`.
    let product = MatMulKernel {
        batch: vec![],
        m,
        n,
        k,
        lhs: Access::contiguous(&[m, k]),
        rhs: Access::contiguous(&[k, n]),
        epilogue: vec![Input(0), Acc, Node::constant(0.01), Binary(BinaryOp::Mul, 1, 2), Binary(BinaryOp::Sub, 0, 3)],
        epilogue_inputs: vec![Access::contiguous(&[m, n])],
        precision: Default::default(),
    };
    let kernel = Kernel::MatMul(product.clone());
    let run = |threads| {
        use_threads(threads, std::time::Duration::ZERO).unwrap();
        let mut out = vec![UNWRITTEN; m * n];
        jit().run(&kernel, &[&lhs, &rhs, &w], &mut out).unwrap();
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    let (alone, split) = (run(1), run(2));
    use_threads(2, std::time::Duration::ZERO).unwrap();
    let parts = super::split_outer(&super::epilogue_map(&product).expect("an epilogue")).len();
    use_threads(1, std::time::Duration::ZERO).unwrap();
    assert_eq!(parts, 2);
    assert!(alone == split, "split epilogue changed bits");
    check(&mut jit(), &kernel, &[&lhs, &rhs, &w], m * n, Tol::Close { rel: 2e-6, abs: 1e-6 });
}

/// `op` of each of `xs`, compiled.
fn jit_unary(jit: &mut Jit, op: UnaryOp, xs: &[f32]) -> Vec<f32> {
    let n = xs.len();
    let k =
        map(&[n], vec![Access::contiguous(&[n])], vec![Node::Input(0), Node::Unary(op, 0)], Access::contiguous(&[n]));
    let mut out = vec![UNWRITTEN; n];
    jit.run(&k, &[xs], &mut out).unwrap();
    out
}

#[test]
fn the_interpreters_vector_functions_give_the_jits_bits() {
    use crate::backend::cpu::vmath;
    let mut jit = jit();
    // Cranelift and the interpreter's loops decide on fused multiply-adds alike.
    assert_eq!(jit.target.fma, vmath::uses_fma());
    let mut xs = special_values();
    xs.extend(values(1, 5_000, -20.0, 20.0));
    xs.extend(values(2, 5_000, -110.0, 90.0));
    xs.extend((0..5_000u64).map(|i| f32::from_bits(1 + (random::uniform(4, i) * 2_139_095_039.0) as u32)));
    // Negative magnitudes too, and a length with a vector tail.
    let negatives: Vec<f32> = xs.iter().map(|x| -x).collect();
    xs.extend(negatives);
    xs.push(0.3);
    let n = xs.len();
    for op in [UnaryOp::Exp, UnaryOp::Log, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Erf] {
        let gt_ir::OpDef::Prim(prim) = op.def() else { unreachable!("{op:?} is a primitive") };
        let fused = jit_unary(&mut jit, op, &xs);
        let f = vmath::slice_fn(prim).expect("a polynomial function");
        let mut interpreted = vec![UNWRITTEN; n];
        f(&xs, &mut interpreted);
        let mut runs = vec![("the host's", interpreted)];
        // Every vector width this host can run (AVX-512, AVX2, FMA alone) gives the same bits.
        if vmath::uses_fma() {
            for level in vmath::fma_levels() {
                let mut out = vec![UNWRITTEN; n];
                vmath::slice_fn_at(prim).expect("a polynomial function")(level, &xs, &mut out);
                runs.push((["", "FMA", "AVX2", "AVX-512"][level as usize], out));
            }
        }
        for (level, interpreted) in runs {
            for ((&x, &i), &j) in xs.iter().zip(&interpreted).zip(&fused) {
                assert!(
                    agrees(j, i, Tol::Exact),
                    "{op:?}({x:e}): interpreter ({level} loop) {i:e} ({:#x}), jit {j:e} ({:#x})",
                    i.to_bits(),
                    j.to_bits()
                );
            }
        }
    }
    // Without fused multiply-adds (hosts without FMA): the baseline functions.
    let mut jit = self::jit();
    jit.target.fma = false;
    let baseline = [
        (UnaryOp::Exp, vmath::exp::<false> as fn(f32) -> f32),
        (UnaryOp::Log, vmath::log::<false>),
        (UnaryOp::Tanh, vmath::tanh::<false>),
        (UnaryOp::Sigmoid, vmath::sigmoid::<false>),
        (UnaryOp::Erf, vmath::erf::<false>),
    ];
    for (op, f) in baseline {
        let fused = jit_unary(&mut jit, op, &xs);
        for (&x, &j) in xs.iter().zip(&fused) {
            let i = f(x);
            assert!(agrees(j, i, Tol::Exact), "{op:?}({x:e}) without FMA: interpreter {i:e}, jit {j:e}");
        }
    }
}

/// A plain map that runs by tiles: 1-D over `n`, inputs read whole or as one element,
/// random primitive nodes (creation nodes, selects and every binary op too), at least one
/// costly op.
fn tiled_case() -> impl Strategy<Value = (Kernel, Vec<Vec<f32>>)> {
    let n = prop_oneof![1usize..40, 500usize..530, 1000usize..2100];
    (n, any::<u64>(), prop::collection::vec(any::<(u8, u32, u32, u32)>(), 1..16)).prop_map(|(n, seed, ops)| {
        let mut rng = seed;
        let mut next = move || {
            rng = random::splitmix64(rng);
            rng
        };
        let n_inputs = 1 + (next() % 3) as usize;
        let (mut inputs, mut data) = (Vec::new(), Vec::new());
        for i in 0..n_inputs {
            let whole = i == 0 || next() % 2 == 0;
            let len = if whole { n } else { 1 };
            inputs.push(if whole { Access::contiguous(&[n]) } else { Access { offset: 0, strides: vec![0] } });
            data.push((0..len).map(|j| random::uniform(next(), j as u64) * 8.0 - 4.0).collect::<Vec<f32>>());
        }
        let mut nodes: Vec<Node> = (0..n_inputs as u32).map(Node::Input).collect();
        let unary = [
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Erf,
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Relu,
            UnaryOp::Sqrt,
            UnaryOp::Rsqrt,
        ];
        let binaries: Vec<BinaryOp> =
            BinaryOp::ALL.iter().copied().filter(|op| matches!(op.def(), gt_ir::OpDef::Prim(_))).collect();
        for (kind, a, b, c) in ops {
            let len = nodes.len() as u32;
            let (a, b, c) = (a % len, b % len, c % len);
            let pick = (kind / 8) as usize;
            nodes.push(match kind % 8 {
                0 | 1 => Node::Unary(unary[pick % unary.len()], a),
                2 | 3 => Node::Binary(binaries[pick % binaries.len()], a, b),
                4 => Node::Select(a, b, c),
                5 => Node::constant(POOL[pick % POOL.len()]),
                6 => [
                    Node::Iota { start: 0.5f64.to_bits(), step: (-0.25f64).to_bits() },
                    Node::Rand { seed: 9 },
                    Node::Randn { seed: 4 },
                ][pick % 3],
                _ => Node::Unary(UnaryOp::Tanh, a),
            });
        }
        let last = nodes.len() as u32 - 1;
        nodes.push(Node::Unary(UnaryOp::Exp, last));
        (map(&[n], inputs, nodes, Access::contiguous(&[n])), data)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Kernels run by tiles give the compiled kernel's bits, across tile boundaries.
    #[test]
    fn tiles_give_the_compiled_bits((kernel, data) in tiled_case()) {
        let Kernel::Map(m) = &kernel else { unreachable!("a map") };
        prop_assert!(tiles::applies(m, false));
        let refs: Vec<&[f32]> = data.iter().map(|d| &d[..]).collect();
        let n = m.numel();
        let (mut tiled, mut compiled) = (vec![UNWRITTEN; n], vec![UNWRITTEN; n]);
        let mut by_tiles = Jit::new().unwrap();
        prop_assert_eq!(by_tiles.run(&kernel, &refs, &mut tiled).unwrap(), Duration::ZERO);
        prop_assert_eq!(by_tiles.stats().compiled, 0, "tiles compile nothing");
        jit().run(&kernel, &refs, &mut compiled).unwrap();
        for (i, (&t, &c)) in tiled.iter().zip(&compiled).enumerate() {
            prop_assert!(agrees(c, t, Tol::Exact), "element {}: tiles {:e}, compiled {:e}\n{}", i, t, c, kernel);
        }
    }
}

#[test]
fn what_runs_by_tiles() {
    let n = 64;
    let whole = Access::contiguous(&[n]);
    let tanh = vec![Node::Input(0), Node::Unary(UnaryOp::Tanh, 0)];
    let Kernel::Map(plain) = map(&[n], vec![whole.clone()], tanh.clone(), whole.clone()) else { unreachable!() };
    assert!(tiles::applies(&plain, false));
    // Without a costly op the compiled loop is as fast; strided reads and writes, rows and
    // composites are compiled.
    let cheap = map(&[n], vec![whole.clone()], vec![Node::Input(0), Node::Unary(UnaryOp::Neg, 0)], whole.clone());
    let backwards = Access { offset: n as i64 - 1, strides: vec![-1] };
    let reversed = map(&[n], vec![backwards.clone()], tanh.clone(), whole.clone());
    let reversed_out = map(&[n], vec![whole.clone()], tanh.clone(), backwards);
    let rows = row_map(&[n], vec![0], vec![whole.clone()], tanh.clone(), whole.clone());
    let softplus =
        map(&[n], vec![whole.clone()], vec![Node::Input(0), Node::Unary(UnaryOp::Softplus, 0)], whole.clone());
    let Kernel::Map(m) = &cheap else { unreachable!() };
    assert!(!tiles::applies(m, false));
    // Over halves or `bool`s (which compiled code would convert whole), cheap maps too; the
    // others are compiled all the same.
    assert!(tiles::applies(m, true));
    for k in [reversed, reversed_out, rows, softplus] {
        let Kernel::Map(m) = &k else { unreachable!() };
        assert!(!tiles::applies(m, false), "{k}");
        assert!(!tiles::applies(m, true), "{k}");
    }
}

#[test]
fn tiles_split_over_threads_give_the_same_bits() {
    use crate::backend::cpu::threads::use_threads;
    let n = (1 << 20) + 1234;
    let x = values(5, n, -6.0, 6.0);
    let nodes = vec![
        Node::Input(0),
        Node::Unary(UnaryOp::Tanh, 0),
        Node::Iota { start: 0f64.to_bits(), step: 1e-6f64.to_bits() },
        Node::Binary(BinaryOp::Mul, 1, 2),
        Node::Unary(UnaryOp::Exp, 3),
    ];
    let k = map(&[n], vec![Access::contiguous(&[n])], nodes, Access::contiguous(&[n]));
    let run = |threads, tiles: bool| {
        use_threads(threads, std::time::Duration::ZERO).unwrap();
        let mut out = vec![UNWRITTEN; n];
        let mut jit = if tiles { Jit::new().unwrap() } else { jit() };
        jit.run(&k, &[&x], &mut out).unwrap();
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    let (alone, split, compiled) = (run(1, true), run(2, true), run(1, false));
    use_threads(1, std::time::Duration::ZERO).unwrap();
    assert!(alone == split && alone == compiled);
}

/// Buffers of halves: widened as read and rounded once as written, by tiles and compiled
/// alike, with every element as the `f32` kernel over the widened values gives it, rounded.
#[test]
fn halves_are_widened_as_read_and_rounded_as_written() {
    use half::{bf16, f16};
    let n = 1500;
    let x = values(3, n, -3.0, 3.0);
    let whole = Access::contiguous(&[n]);
    let one = Access { offset: 0, strides: vec![0] };
    let tiled = map(
        &[n],
        vec![whole.clone(), one.clone()],
        vec![Node::Input(0), Node::Input(1), Node::Binary(BinaryOp::Mul, 0, 1), Node::Unary(UnaryOp::Tanh, 2)],
        whole.clone(),
    );
    let compiled = map(
        &[n],
        vec![whole.clone(), one],
        vec![Node::Input(0), Node::Input(1), Node::Binary(BinaryOp::Mul, 0, 1), Node::Unary(UnaryOp::Neg, 2)],
        whole,
    );
    let (xb, xh): (Vec<bf16>, Vec<f16>) =
        (x.iter().map(|&v| bf16::from_f32(v)).collect(), x.iter().map(|&v| f16::from_f32(v)).collect());
    let (sb, sh) = ([bf16::from_f32(1.3)], [f16::from_f32(1.3)]);
    for kernel in [&tiled, &compiled] {
        let mut jit = Jit::new().unwrap();
        // bf16 in, bf16 out.
        let mut want = vec![0f32; n];
        let wide: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
        jit.run(kernel, &[&wide, &[sb[0].to_f32()]], &mut want).unwrap();
        let mut got = vec![bf16::ZERO; n];
        jit.run_stored(kernel, &[Stored::Bf16(&xb), Stored::Bf16(&sb)], StoredMut::Bf16(&mut got)).unwrap();
        let want_b: Vec<u16> = want.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want_b, "{kernel}");
        // f16 and f32 in, f32 out (no rounding of the result).
        let wide: Vec<f32> = xh.iter().map(|v| v.to_f32()).collect();
        jit.run(kernel, &[&wide, &[1.3]], &mut want).unwrap();
        let mut got = vec![0f32; n];
        jit.run_stored(kernel, &[Stored::F16(&xh), Stored::F32(&[1.3])], StoredMut::F32(&mut got)).unwrap();
        assert_eq!(bits(&got), bits(&want), "{kernel}");
        // f16 out.
        let mut got = vec![f16::ZERO; n];
        jit.run_stored(kernel, &[Stored::F16(&xh), Stored::F16(&sh)], StoredMut::F16(&mut got)).unwrap();
        let wide_s = sh[0].to_f32();
        jit.run(kernel, &[&wide, &[wide_s]], &mut want).unwrap();
        let want_h: Vec<u16> = want.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want_h, "{kernel}");
        // Out of bounds is an error, not a read past the end.
        let short = vec![bf16::ZERO; n - 1];
        let mut out = vec![bf16::ZERO; n];
        assert!(jit.run_stored(kernel, &[Stored::Bf16(&short), Stored::Bf16(&sb)], StoredMut::Bf16(&mut out)).is_err());
    }
}

/// A mask (`bool` buffer) read by an `f32` kernel, by tiles and compiled alike, whole and
/// broadcast from one element: 0 and 1, as the kernel over the mask widened gives it; and
/// its result stored as `bool`s.
#[test]
fn masks_are_read_as_zero_and_one() {
    let mut stored = [true; 5];
    <bool as super::tiles::Store<f32>>::write(&[f32::NAN, -0.0, 0.0, 2.0, f32::NEG_INFINITY], &mut stored);
    assert_eq!(stored, [true, false, false, true, true]);
    let n = 1500;
    let x = values(5, n, -3.0, 3.0);
    let mask: Vec<bool> = (0..n).map(|i| i % 3 != 1).collect();
    let whole = Access::contiguous(&[n]);
    let one = Access { offset: 0, strides: vec![0] };
    let masked = |costly: UnaryOp| {
        map(
            &[n],
            vec![whole.clone(), whole.clone(), one.clone()],
            vec![
                Node::Input(0),
                Node::Input(1),
                Node::Input(2),
                Node::Unary(costly, 1),
                Node::constant(-7.0),
                Node::Select(0, 3, 4),
                Node::Binary(BinaryOp::Mul, 5, 2),
            ],
            whole.clone(),
        )
    };
    for kernel in [&masked(UnaryOp::Exp), &masked(UnaryOp::Neg)] {
        for scalar in [true, false] {
            let mut jit = Jit::new().unwrap();
            let widened: Vec<f32> = mask.iter().map(|&m| if m { 1.0 } else { 0.0 }).collect();
            let mut want = vec![0f32; n];
            jit.run(kernel, &[&widened, &x, &[if scalar { 1.0 } else { 0.0 }]], &mut want).unwrap();
            let mut got = vec![0f32; n];
            let inputs = [Stored::Bool(&mask), Stored::F32(&x), Stored::Bool(&[scalar])];
            jit.run_stored(kernel, &inputs, StoredMut::F32(&mut got)).unwrap();
            assert_eq!(bits(&got), bits(&want), "{kernel}");
            if scalar {
                // The mask picks: -7 exactly where it is false.
                assert!(got.iter().zip(&mask).all(|(&v, &m)| m == (v != -7.0)), "{kernel}");
            }
            // Stored as `bool`s: nonzero (NaN too) is true, as `.to(bool)`.
            let mut truth = vec![false; n];
            jit.run_stored(kernel, &inputs, StoredMut::Bool(&mut truth)).unwrap();
            assert_eq!(truth, want.iter().map(|&v| v != 0.0).collect::<Vec<_>>(), "{kernel}");
            assert!(if scalar { truth.iter().any(|&t| t) } else { truth.iter().all(|&t| !t) }, "{kernel}");
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Case `c` as a map computing in `compute` (`f64` or `i64`): with its rows and reductions
/// (integer means as sums) or, by `salt`, a plain map (reductions become negations); its unary ops range over the whole table or wrap through `f32` or `i32`
/// (`salt` picks), an `f64` kernel's buffers are `f64` or `bool` (its result too), an `i64`
/// kernel's `i64`, `i32` or `bool` (`salt` picks) holding the pool's values scaled so that
/// products overflow, and its result is wrapped through `i32` or `bool` at the end.
fn wide_case(c: &Case, compute: Compute, salt: u64) -> (Kernel, Vec<Value>, gt_ir::TensorType) {
    use gt_ir::DType;
    let pick = |k: u64, options: &[DType]| options[((salt >> (3 * k)) % options.len() as u64) as usize];
    // Half the cases keep their rows and reductions (integer means are sums).
    let rows = salt >> 62 & 1 == 1;
    let op = |op: ReduceOp| if op == ReduceOp::Mean && compute == Compute::I64 { ReduceOp::Sum } else { op };
    let mut nodes: Vec<Node> = c
        .nodes
        .iter()
        .map(|&n| match n {
            Node::Reduce(o, a) if rows => Node::Reduce(op(o), a),
            Node::Reduce(_, a) => Node::Unary(UnaryOp::Neg, a),
            // Some unary ops become a wrap through a narrower dtype, mid-expression.
            Node::Unary(op, a) if (op as u64).wrapping_add(salt).is_multiple_of(4) => {
                Node::Round(if compute == Compute::F64 { Storage::F32 } else { Storage::I32 }, a)
            }
            Node::Unary(op, a) => {
                Node::Unary(UnaryOp::ALL[(op as usize).wrapping_add(salt as usize) % UnaryOp::ALL.len()], a)
            }
            n => n,
        })
        .collect();
    let last = nodes.len() as u32 - 1;
    let (inputs, output): (Vec<Value>, DType) = if compute == Compute::F64 {
        // Some buffers are masks (`bool`s read as 0 and 1).
        let values = c.inputs.iter().enumerate().map(|(i, (d, _))| {
            let data = match pick(i as u64, &[DType::F64, DType::F64, DType::Bool]) {
                DType::Bool => Elements::Bool(d.iter().map(|&x| x > 0.0).collect()),
                _ => Elements::F64(d.iter().map(|&x| f64::from(x) * 1.1).collect()),
            };
            Value::from_elements(&[d.len()], data)
        });
        // Some results are stored as `bool`s (nonzero, NaN too, is true).
        (values.collect(), pick(5, &[DType::F64, DType::F64, DType::Bool]))
    } else {
        let values = c.inputs.iter().enumerate().map(|(i, (d, _))| {
            let ints = d.iter().map(|&x| x as i64);
            let data = match pick(i as u64, &[DType::I64, DType::I32, DType::I32, DType::Bool]) {
                DType::I64 => Elements::I64(ints.map(|x| x.wrapping_mul(3 << 40)).collect()),
                DType::I32 => Elements::I32(ints.map(|x| x.wrapping_mul(40_000) as i32).collect()),
                _ => Elements::Bool(ints.map(|x| x > 0).collect()),
            };
            Value::from_elements(&[d.len()], data)
        });
        // A wrap through `i32` whose sign decides the result.
        nodes.extend([
            Node::Round(Storage::I32, last),
            Node::constant(0.0),
            Node::Binary(BinaryOp::Lt, last + 1, last + 2),
            Node::Select(last + 3, last + 1, last),
        ]);
        let last = last + 4;
        let output = pick(5, &[DType::I64, DType::I32, DType::Bool]);
        match output {
            DType::I32 => nodes.push(Node::Round(Storage::I32, last)),
            DType::Bool => nodes.push(Node::Round(Storage::Bool, last)),
            _ => {}
        }
        (values.collect(), output)
    };
    let kernel = Kernel::Map(MapKernel {
        shape: c.shape.clone(),
        inputs: c.inputs.iter().map(|(_, a)| a.clone()).collect(),
        nodes,
        output: c.output.clone(),
        rows: if rows { c.rows.clone() } else { vec![] },
        reduce: if rows { c.reduce.map(op) } else { None },
        compute,
    });
    (kernel, inputs, gt_ir::TensorType::new(output, vec![c.out_len]))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// `f64` and integer maps (every unary op, every binary op, `where`, wrapping through
    /// `i32` and `bool`, buffers of every integer dtype, strided, broadcast and backwards
    /// layouts, NaN and infinities, overflowing products): the oracle's bits.
    #[test]
    fn random_f64_and_integer_dags_match_the_oracle(c in case(false), salt in any::<u64>(), float in any::<bool>()) {
        let compute = if float { Compute::F64 } else { Compute::I64 };
        let (kernel, inputs, t) = wide_case(&c, compute, salt);
        let storage = BufferStorage {
            output: Storage::of(t.dtype),
            inputs: inputs.iter().map(|v| v.wide().expect("a wide dtype").storage()).collect(),
        };
        // Empty rows are the oracle's.
        prop_assume!(Jit::compiles_wide(&kernel, &storage));
        compare_wide(&mut jit(), &kernel, &inputs, &t).map_err(TestCaseError::fail)?;
        // Plain `f64` maps with transcendental functions run by tiles where a JIT may.
        compare_wide(&mut Jit::new().unwrap(), &kernel, &inputs, &t).map_err(TestCaseError::fail)?;
    }
}

/// `f64` maps with transcendental functions run by tiles (`tiles::applies_f64`): every
/// node kind they take (inputs whole and broadcast, `bool` masks, both constants, each
/// function, a binary op, `where`, rounding through `f32`), results stored as `f64` and
/// `bool`, over special values and lengths that leave partial tiles or split over threads:
/// the compiled kernel's bits and the oracle's.
#[test]
fn f64_kernels_by_tiles_give_the_compiled_and_the_oracles_bits() {
    use gt_ir::DType;
    for n in [0usize, 1, 7, 512, 513, 70_001] {
        let special = [0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 800.0, -800.0, 1e-310];
        let x: Vec<f64> = (0..n)
            .map(|i| special.get(i % 97).copied().unwrap_or(f64::from(random::uniform(9, i as u64)) * 12.0 - 6.0))
            .collect();
        let mask: Vec<bool> = (0..n).map(|i| i % 5 != 2).collect();
        let whole = Access::contiguous(&[n]);
        let one = Access { offset: 0, strides: vec![0] };
        let nodes = vec![
            Node::Input(0),
            Node::Input(1),
            Node::Input(2),
            Node::Const64(0.3f64.to_bits()),
            Node::constant(1.5),
            Node::Binary(BinaryOp::Mul, 0, 3),
            Node::Binary(BinaryOp::Add, 5, 4),
            Node::Unary(UnaryOp::Tanh, 6),
            Node::Unary(UnaryOp::Exp, 5),
            Node::Unary(UnaryOp::Abs, 0),
            Node::Unary(UnaryOp::Log, 9),
            Node::Unary(UnaryOp::Sigmoid, 10),
            Node::Unary(UnaryOp::Erf, 8),
            Node::Round(Storage::F32, 11),
            Node::Binary(BinaryOp::Sub, 12, 13),
            Node::Binary(BinaryOp::Mul, 14, 7),
            Node::Select(1, 15, 2),
        ];
        let kernel = Kernel::Map(MapKernel {
            shape: vec![n],
            inputs: vec![whole.clone(), whole.clone(), one],
            nodes,
            output: whole,
            rows: vec![],
            reduce: None,
            compute: Compute::F64,
        });
        let inputs = [
            Value::from_elements(&[n], Elements::F64(x.clone())),
            Value::from_elements(&[n], Elements::Bool(mask.clone())),
            Value::from_elements(&[1], Elements::F64(vec![-2.5])),
        ];
        for output in [DType::F64, DType::Bool] {
            let storage = BufferStorage {
                output: Storage::of(output),
                inputs: inputs.iter().map(|v| v.wide().unwrap().storage()).collect(),
            };
            let Kernel::Map(m) = &kernel else { unreachable!() };
            assert!(super::tiles::applies_f64(m, &storage), "{kernel}");
            let t = gt_ir::TensorType::new(output, vec![n]);
            compare_wide(&mut Jit::new().unwrap(), &kernel, &inputs, &t).unwrap();
            compare_wide(&mut jit(), &kernel, &inputs, &t).unwrap();
        }
    }
}

#[test]
fn f64_ops_compiled_inline_give_the_eager_bits_at_their_extremes() {
    // `f64` kernels emit `math64`'s functions and the composites' expansions inline: every
    // unary and binary op, over the values where those functions change case (overflow and
    // underflow of `exp`, subnormals through `ln`, the ends of `erf`'s ranges), as a plain
    // map compiled (not tiled) and as a row kernel, against the eager op's bits; on this
    // host, and as for a CPU without FMA and SSE 4.1 (`fma`, `nearest`, `floor` as calls).
    let mut xs = vec![
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN_POSITIVE,
        5e-324,
        -5e-324,
        1e-310,
        2.2e-308,
        1e-300,
        1e300,
        f64::MAX,
        -f64::MAX,
        709.78,
        709.79,
        -708.4,
        -745.1,
        -745.2,
        -744.0,
        1e-9,
        0.84375,
        1.25,
        6.0,
        2f64.powi(-28),
        27.0,
        -19.0,
        0.5,
        1.0,
        -1.0,
        2.0,
        3.0,
    ];
    let more: Vec<f64> = xs.iter().map(|x| -x).collect();
    xs.extend(more);
    xs.extend((0..400).map(|i| f64::from(random::uniform(21, i)) * 60.0 - 30.0));
    let n = xs.len();
    let ys: Vec<f64> = (0..n).map(|i| xs[(i * 7 + 3) % n]).collect();
    let whole = Access::contiguous(&[n]);
    let inputs = [Value::from_elements(&[n], Elements::F64(xs)), Value::from_elements(&[n], Elements::F64(ys))];
    let t = gt_ir::TensorType::new(gt_ir::DType::F64, vec![n]);
    let old = Jit::without(&["has_fma", "has_sse41", "has_avx"]).unwrap().compiling_all();
    for mut jit in [jit(), old] {
        let ops: Vec<Node> = UnaryOp::ALL
            .iter()
            .map(|&op| Node::Unary(op, 0))
            .chain(BinaryOp::ALL.iter().map(|&op| Node::Binary(op, 0, 1)))
            .collect();
        for op in ops {
            let nodes = vec![Node::Input(0), Node::Input(1), op];
            let mut plain = MapKernel {
                shape: vec![n],
                inputs: vec![whole.clone(), whole.clone()],
                nodes: nodes.clone(),
                output: whole.clone(),
                rows: vec![],
                reduce: None,
                compute: Compute::F64,
            };
            compare_wide(&mut jit, &Kernel::Map(plain.clone()), &inputs, &t).unwrap();
            // Each element over its row's sum (one row): the op in a row kernel's final pass.
            let last = plain.nodes.len() as u32 - 1;
            plain.nodes.push(Node::Reduce(ReduceOp::Sum, last));
            plain.nodes.push(Node::Binary(BinaryOp::Sub, last, last + 1));
            plain.rows = vec![0];
            compare_wide(&mut jit, &Kernel::Map(plain), &inputs, &t).unwrap();
        }
    }
}
