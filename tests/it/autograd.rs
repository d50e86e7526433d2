//! Autograd: finite-difference checks of every differentiable op across broadcasting shapes
//! (property tests on the reference interpreter), and PyTorch's semantics (accumulation on
//! leaves, no gradient on non-leaves, a graph used once, in-place checks, no_grad, the tape).

use gt::nn::{self, Module, Optimizer};
use gt::{range_step, s, step, Runtime, Tensor, NEW};
use proptest::prelude::*;

type Op = fn(&[Tensor]) -> gt::frontend::tensor::Result<Tensor>;
type Forward<'a> = &'a dyn Fn(&[Tensor]) -> gt::frontend::tensor::Result<Tensor>;

/// A deterministic weight per element, so the loss `sum(f(x) * w)` has a gradient with
/// every element mattering differently.
fn weights(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.3 + ((i * 7919) % 13) as f32 / 10.0).collect()
}

fn loss(f: Forward<'_>, inputs: &[Tensor]) -> Tensor {
    let y = f(inputs).expect("forward");
    let w = gt::from_vec(weights(y.numel()), y.shape()).unwrap();
    y.mul(&w).unwrap().sum().unwrap()
}

/// Compares the gradient autograd gives with central differences, for every input.
fn check(f: Forward<'_>, inputs: &[(Vec<f32>, Vec<usize>)]) -> Result<(), TestCaseError> {
    let _gt = Runtime::reference();
    let leaves: Vec<Tensor> =
        inputs.iter().map(|(d, s)| gt::from_vec(d.clone(), s).unwrap().requires_grad_(true).unwrap()).collect();
    loss(f, &leaves).backward().unwrap();
    let eps = 1e-2f32;
    for (i, (data, shape)) in inputs.iter().enumerate() {
        let analytic = leaves[i].grad().expect("a leaf that requires grad gets a gradient").to_vec().unwrap();
        prop_assert_eq!(analytic.len(), data.len());
        for j in 0..data.len() {
            let at = |delta: f32| {
                let _off = gt::no_grad();
                let xs: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(k, (d, s))| {
                        let mut d = d.clone();
                        if k == i {
                            d[j] += delta;
                        }
                        gt::from_vec(d, s).unwrap()
                    })
                    .collect();
                loss(f, &xs).item().unwrap() as f64
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps as f64);
            let a = analytic[j] as f64;
            prop_assert!(
                (a - numeric).abs() <= 2e-2 * (1.0 + numeric.abs()),
                "input {} {:?} element {}: autograd {} vs finite difference {}",
                i,
                shape,
                j,
                a,
                numeric
            );
        }
    }
    Ok(())
}

/// Shapes that broadcast against `[a, b]`.
fn broadcast_shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (1usize..4, 1usize..4, 0usize..6, 0usize..6).prop_map(|(a, b, i, j)| {
        let options = [vec![a, b], vec![b], vec![a, 1], vec![1, b], vec![], vec![2, a, b]];
        (options[i].clone(), options[j].clone())
    })
}

/// Values away from 0 (and from each other, mostly), so kinks and ties are not crossed.
fn data(n: usize, positive: bool) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec((0.2f32..1.5, any::<bool>()), n)
        .prop_map(move |v| v.into_iter().map(|(x, neg)| if neg && !positive { -x } else { x }).collect())
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

const UNARY: &[(&str, Op, bool)] = &[
    ("neg", |x| x[0].neg(), false),
    ("abs", |x| x[0].abs(), false),
    ("relu", |x| x[0].relu(), false),
    ("sigmoid", |x| x[0].sigmoid(), false),
    ("tanh", |x| x[0].tanh(), false),
    ("exp", |x| x[0].exp(), false),
    ("log", |x| x[0].log(), true),
    ("sqrt", |x| x[0].sqrt(), true),
    ("rsqrt", |x| x[0].rsqrt(), true),
    ("erf", |x| x[0].erf(), false),
    ("softplus", |x| x[0].softplus(), false),
];

/// Every elementwise op of the table is gradient-checked here (comparisons have none).
#[test]
fn every_op_of_the_table_is_checked() {
    let unary: Vec<&str> = gt::ir::UnaryOp::ALL.iter().map(|op| op.mnemonic()).collect();
    assert_eq!(UNARY.iter().map(|u| u.0).collect::<Vec<_>>(), unary);
    let binary: Vec<&str> =
        gt::ir::BinaryOp::ALL.iter().filter(|op| !op.is_comparison()).map(|op| op.mnemonic()).collect();
    assert_eq!(BINARY.iter().map(|b| b.0).filter(|n| *n != "where").collect::<Vec<_>>(), binary);
}

const BINARY: &[(&str, Op, bool)] = &[
    ("add", |x| x[0].add(&x[1]), false),
    ("sub", |x| x[0].sub(&x[1]), false),
    ("mul", |x| x[0].mul(&x[1]), false),
    ("div", |x| x[0].div(&x[1]), true),
    ("pow", |x| x[0].pow(&x[1]), true),
    ("maximum", |x| x[0].maximum(&x[1].mul(1.01)?), false),
    ("minimum", |x| x[0].minimum(&x[1].mul(1.01)?), false),
    ("where", |x| gt::where_(&x[0].gt(0.0)?, &x[0], &x[1]), false),
];

const SCALAR: &[(&str, Op, bool)] = &[
    ("add scalar", |x| x[0].add(0.5), false),
    ("scalar sub", |x| x[0].rsub(0.5), false),
    ("mul scalar", |x| x[0].mul(-1.5), false),
    ("div scalar", |x| x[0].div(3.0), false),
    ("scalar div", |x| x[0].rdiv(2.0), true),
    ("pow scalar", |x| x[0].pow(2.5), true),
    ("pow 0", |x| x[0].pow(0.0), true),
    ("scalar pow", |x| gt::frontend::tensor::full(&[], 1.7)?.pow(&x[0]), false),
    ("maximum scalar", |x| x[0].maximum(0.1), false),
    ("where scalar", |x| gt::where_(&x[0].lt(0.0)?, 0.25, &x[0]), false),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn unary_ops((shape, _) in broadcast_shapes(), op in 0..UNARY.len(), x in data(24, false)) {
        let (_, f, positive) = UNARY[op];
        let x: Vec<f32> = x[..numel(&shape)].iter().map(|v| if positive { v.abs() } else { *v }).collect();
        check(&f, &[(x, shape)])?;
    }

    #[test]
    fn binary_ops_broadcast((sa, sb) in broadcast_shapes(), op in 0..BINARY.len(), xa in data(24, true), xb in data(24, true), signs in any::<u32>()) {
        let (_, f, positive) = BINARY[op];
        let signed = |v: &[f32], n: usize, salt: u32| -> Vec<f32> {
            v[..n].iter().enumerate().map(|(i, x)| if !positive && (signs.rotate_left(salt + i as u32) & 1 == 1) { -x } else { *x }).collect()
        };
        let a = signed(&xa, numel(&sa), 0);
        let b = signed(&xb, numel(&sb), 7);
        if BINARY[op].0.ends_with("imum") {
            // Finite differences across a tie measure the kink, not the gradient.
            let _gt = Runtime::reference();
            let (ta, tb) = (gt::from_vec(a.clone(), &sa).unwrap(), gt::from_vec(b.clone(), &sb).unwrap());
            let gap = ta.sub(&tb.mul(1.01).unwrap()).unwrap().abs().unwrap().min().unwrap().item().unwrap();
            prop_assume!(gap > 0.03);
        }
        check(&f, &[(a, sa), (b, sb)])?;
    }

    #[test]
    fn scalar_operands((shape, _) in broadcast_shapes(), op in 0..SCALAR.len(), x in data(24, false)) {
        let (_, f, positive) = SCALAR[op];
        let x: Vec<f32> = x[..numel(&shape)].iter().map(|v| if positive { v.abs() } else { *v }).collect();
        check(&f, &[(x, shape)])?;
    }

    #[test]
    fn reductions(a in 1usize..4, b in 1usize..4, c in 1usize..3, op in 0usize..4, axes in 0usize..5, keepdim in any::<bool>(), x in data(36, false)) {
        let shape = vec![a, b, c];
        let n = numel(&shape);
        // Distinct values so max/min have no ties.
        let x: Vec<f32> = x[..n].iter().enumerate().map(|(i, v)| v * 0.1 + i as f32 * 0.37).collect();
        let axes_of: [Option<&[i64]>; 5] = [None, Some(&[0]), Some(&[-1]), Some(&[0, 2]), Some(&[1])];
        let run = |t: &Tensor| -> gt::frontend::tensor::Result<Tensor> {
            match (op, axes_of[axes]) {
                (0, None) => t.sum(),
                (1, None) => t.mean(),
                (2, None) => t.max(),
                (3, None) => t.min(),
                (0, Some(ax)) => t.sum_dims(ax, keepdim),
                (1, Some(ax)) => t.mean_dims(ax, keepdim),
                (2, Some(ax)) => t.max_dims(ax, keepdim),
                (_, Some(ax)) => t.min_dims(ax, keepdim),
                _ => unreachable!(),
            }
        };
        check(&|x| run(&x[0]), &[(x, shape)])?;
    }

    #[test]
    fn matmuls(m in 1usize..4, k in 1usize..4, n in 1usize..4, form in 0usize..6, x in data(48, false), y in data(48, false)) {
        let (sa, sb) = match form {
            0 => (vec![m, k], vec![k, n]),
            1 => (vec![k], vec![k, n]),
            2 => (vec![m, k], vec![k]),
            3 => (vec![k], vec![k]),
            4 => (vec![2, m, k], vec![k, n]),
            _ => (vec![m, k], vec![3, k, n]),
        };
        let (a, b) = (x[..numel(&sa)].to_vec(), y[..numel(&sb)].to_vec());
        check(&|x| x[0].matmul(&x[1]), &[(a, sa), (b, sb)])?;
    }
}

const VIEWS: &[(&str, Op)] = &[
    ("transpose", |x| x[0].transpose(0, 2)),
    ("t", |x| x[0].t()),
    ("permute", |x| x[0].permute(&[1, 2, 0])),
    ("reshape", |x| x[0].reshape(&[-1, 2])),
    ("squeeze", |x| x[0].unsqueeze(1)?.squeeze(1)),
    ("squeeze_all", |x| x[0].reshape(&[1, 2, 3, 1, 4])?.squeeze_all()),
    ("unsqueeze", |x| x[0].unsqueeze(-1)),
    ("broadcast_to", |x| x[0].slice(&s![.., 0..1, ..])?.broadcast_to(&[2, 2, 3, 4])),
    ("slice range", |x| x[0].slice(&s![.., 1..3])),
    ("slice index", |x| x[0].slice(&s![1, .., 2])),
    ("slice step", |x| x[0].slice(&s![.., step(.., 2), step(1.., 2)])),
    ("slice negative step", |x| x[0].slice(&s![step(.., -1), range_step(2, 0, -1), step(.., -3)])),
    ("slice new axis", |x| x[0].slice(&s![NEW, .., -1])),
    ("slice empty", |x| x[0].slice(&s![.., 2..2])),
    ("cat", |x| gt::cat(&[&x[0], &x[0].mul(2.0)?, &x[0].slice(&s![.., 0..1])?], 1)),
    ("split", |x| {
        let p = x[0].split(2, 2)?;
        p[1].mul(3.0)?.add(&p[0])
    }),
    ("chunk", |x| {
        let p = x[0].chunk(3, 1)?;
        gt::cat(&[&p[2], &p[0]], 1)
    }),
    ("split_sizes unused piece", |x| Ok(x[0].split_sizes(&[1, 3], 2)?.remove(1))),
];

const FUNCTIONS: &[(&str, Op)] = &[
    ("softmax", |x| nn::softmax(&x[0], -1)),
    ("log_softmax", |x| nn::log_softmax(&x[0], 1)),
    ("layer_norm", |x| nn::layer_norm(&x[0], 1e-5)),
    ("layer_norm over two axes", |x| nn::layer_norm_over(&x[0], 2, 1e-5)),
    ("gelu", |x| nn::gelu(&x[0])),
    ("gelu_tanh", |x| nn::gelu_tanh(&x[0])),
    ("mse", |x| nn::mse_loss(&x[0], &x[0].mul(0.5)?.add(0.3)?)),
    ("bce", |x| nn::binary_cross_entropy(&x[0].sigmoid()?, &x[0].gt(0.0)?)),
    ("bce logits", |x| nn::binary_cross_entropy_with_logits(&x[0], &x[0].gt(0.5)?)),
    ("cross entropy", |x| {
        let x2 = x[0].reshape(&[6, 4])?;
        nn::cross_entropy(&x2, &nn::one_hot(&[0, 3, 1, 2, 2, 0], 4)?)
    }),
];

#[test]
fn views_slices_and_joins() {
    let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin() + 0.05).collect();
    for (name, f) in VIEWS {
        check(f, &[(x.clone(), vec![2, 3, 4])]).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn nn_functions_and_losses() {
    let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.71).sin() * 2.0).collect();
    for (name, f) in FUNCTIONS {
        check(f, &[(x.clone(), vec![2, 3, 4])]).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn a_layer_norm_normalizes_over_its_whole_shape_and_refuses_another() {
    let _gt = Runtime::reference();
    let x = gt::from_vec(vec![1., 2., 4., 0., 0., 1.], &[1, 2, 3]).unwrap();
    let y = nn::LayerNorm::over(&[2, 3]).unwrap().forward(&x).unwrap();
    // PyTorch's LayerNorm((2, 3)) of the same input.
    let torch = [-0.242_534_94f32, 0.485_070_05, 1.940_28, -0.970_14, -0.970_14, -0.242_534_94];
    for (got, want) in y.to_vec().unwrap().iter().zip(torch) {
        assert!((got - want).abs() < 1e-5, "{:?} against PyTorch's {torch:?}", y.to_vec().unwrap());
    }
    let err = nn::LayerNorm::new(4).unwrap().forward(&x).unwrap_err().to_string();
    assert!(err.contains("LayerNorm") && err.contains("[4]") && err.contains("[1, 2, 3]"), "{err}");
}

#[test]
fn gradients_accumulate_on_leaves_until_zeroed() {
    let _gt = Runtime::reference();
    let w = gt::tensor(&[1., 2.]).unwrap().requires_grad_(true).unwrap();
    let h = w.mul(3.0).unwrap();
    h.sum().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![3., 3.]);
    assert!(h.grad().is_none(), "non-leaves keep no gradient");
    w.mul(&w).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![5., 7.]);
    w.zero_grad();
    assert!(w.grad().is_none());
    // A value used twice gets both contributions.
    let y = w.mul(&w).unwrap().add(&w).unwrap().sum().unwrap();
    y.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![3., 5.]);
}

#[test]
fn a_gradient_has_its_inputs_dtype_so_optimizers_step_with_mixed_dtypes() {
    use gt::ir::DType;
    let _gt = Runtime::reference();
    // An f32 weight meeting f64 data (NumPy's default), and an f16 weight beside f32 ones.
    let w = gt::tensor(&[1., 2.]).unwrap().requires_grad_(true).unwrap();
    let x = gt::from_data(vec![0.5f64, 1.5], &[2]).unwrap();
    let h = gt::tensor(&[3., 4.]).unwrap().to(DType::F16).unwrap().requires_grad_(true).unwrap();
    let y = w.mul(&x).unwrap().mul(&h).unwrap();
    assert_eq!(y.dtype(), DType::F64);
    y.sum().unwrap().backward().unwrap();
    let (gw, gh) = (w.grad().unwrap(), h.grad().unwrap());
    assert_eq!((gw.dtype(), gh.dtype()), (DType::F32, DType::F16));
    assert_eq!(gw.to_vec().unwrap(), vec![1.5, 6.0]);
    assert_eq!(gh.to(DType::F32).unwrap().to_vec().unwrap(), vec![0.5, 3.0]);
    let mut sgd = nn::Sgd::new(vec![w.clone(), h.clone()], 0.5);
    sgd.step().unwrap();
    assert_eq!(w.to_vec().unwrap(), vec![0.25, -1.0]);
    assert_eq!(h.dtype(), DType::F16);
}

#[test]
fn misuse_is_an_error_not_a_wrong_gradient() {
    let _gt = Runtime::reference();
    let w = gt::tensor(&[1., 2.]).unwrap().requires_grad_(true).unwrap();
    let l = w.exp().unwrap().sum().unwrap();
    l.backward().unwrap();
    let e = l.backward().unwrap_err().to_string();
    assert!(e.contains("already used by a backward"), "{e}");
    assert!(w.mul(2.0).unwrap().backward().unwrap_err().to_string().contains("one element"));
    assert!(gt::ones(&[1]).unwrap().backward().unwrap_err().to_string().contains("does not require grad"));
    assert!(w.sub_assign(1.0).unwrap_err().to_string().contains("no_grad"));
    assert!(w.mul(2.0).unwrap().requires_grad_(false).is_err());
    // An in-place update cannot carry a gradient.
    let x = gt::zeros(&[2]).unwrap();
    assert!(x.add_assign(&w).unwrap_err().to_string().contains("cannot carry a gradient"));
}

#[test]
fn in_place_updates_after_the_forward_do_not_change_its_gradient() {
    let _gt = Runtime::reference();
    let w = gt::tensor(&[1., 2.]).unwrap().requires_grad_(true).unwrap();
    let x = gt::tensor(&[3., 4.]).unwrap();
    let l = w.mul(&x).unwrap().mul(&w).unwrap().sum().unwrap();
    x.add_assign(100.0).unwrap(); // x requires no grad: allowed
    {
        let _off = gt::no_grad();
        w.sub_assign(1.0).unwrap();
    }
    l.backward().unwrap();
    // d/dw sum(w x w) = 2 w x with the values the forward read: w = [1, 2], x = [3, 4].
    assert_eq!(w.grad().unwrap().to_vec().unwrap(), vec![6., 16.]);
}

#[test]
fn review_regressions() {
    let _gt = Runtime::reference();
    // Two leaves receiving the same gradient keep separate handles.
    let x = gt::tensor(&[1., 2.]).unwrap().requires_grad_(true).unwrap();
    let y = gt::tensor(&[3., 4.]).unwrap().requires_grad_(true).unwrap();
    x.add(&y).unwrap().sum().unwrap().backward().unwrap();
    {
        let _off = gt::no_grad();
        x.grad().unwrap().mul_assign(0.5).unwrap();
    }
    assert_eq!(y.grad().unwrap().to_vec().unwrap(), vec![1., 1.]);
    // Binary cross-entropy at saturated probabilities: finite loss and gradient.
    let p = gt::tensor(&[0., 1., 0.5]).unwrap().requires_grad_(true).unwrap();
    let t = gt::tensor(&[0., 1., 1.]).unwrap();
    nn::binary_cross_entropy(&p, &t).unwrap().backward().unwrap();
    let g = p.grad().unwrap().to_vec().unwrap();
    // The derivative of the clamped loss: finite (it was NaN through log's 0/0).
    let want = [1.0 / 3.0, -1.0 / 3.0, -2.0 / 3.0];
    assert!(g.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{g:?}");
    // Each logarithm clamped at -100 exactly, as PyTorch's (e^-100 as an f32 gave -99.98).
    let wrong = nn::binary_cross_entropy(&gt::tensor(&[0., 1.]).unwrap(), &gt::tensor(&[1., 0.]).unwrap()).unwrap();
    assert_eq!(wrong.item().unwrap(), 100.0);
    // pow: zero exponents and zero bases give 0, not NaN.
    let b = gt::tensor(&[0., 2.]).unwrap().requires_grad_(true).unwrap();
    let e = gt::tensor(&[0., 0.5]).unwrap().requires_grad_(true).unwrap();
    b.pow(&e).unwrap().sum().unwrap().backward().unwrap();
    assert!(b.grad().unwrap().to_vec().unwrap().iter().all(|v| v.is_finite()));
    let z = gt::frontend::tensor::full(&[], 0.0).unwrap();
    let e2 = gt::tensor(&[0.5, 2.]).unwrap().requires_grad_(true).unwrap();
    z.pow(&e2).unwrap().sum().unwrap().backward().unwrap();
    assert_eq!(e2.grad().unwrap().to_vec().unwrap(), vec![0., 0.]);
    // Adam's bias correction counts each parameter's own steps.
    let a = gt::tensor(&[1.]).unwrap().requires_grad_(true).unwrap();
    let c = gt::tensor(&[1.]).unwrap().requires_grad_(true).unwrap();
    let mut adam = nn::Adam::new(vec![a.clone(), c.clone()], 0.01);
    a.mul(2.0).unwrap().sum().unwrap().backward().unwrap();
    adam.step().unwrap();
    adam.zero_grad();
    c.mul(2.0).unwrap().sum().unwrap().backward().unwrap();
    adam.step().unwrap();
    assert!((c.item().unwrap() - 0.99).abs() < 1e-6, "first step of c: {}", c.item().unwrap());
    // no_grad guards may drop in any order.
    let g1 = gt::no_grad();
    let g2 = gt::no_grad();
    drop(g1);
    assert!(!gt::is_grad_enabled());
    drop(g2);
    assert!(gt::is_grad_enabled());
}

#[test]
fn no_grad_records_nothing_and_the_tape_shows_the_graph() {
    let _gt = Runtime::reference();
    let w = gt::randn(&[3, 2]).unwrap().requires_grad_(true).unwrap();
    let x = gt::randn(&[4, 3]).unwrap();
    {
        let _off = gt::no_grad();
        let y = x.matmul(&w).unwrap();
        assert!(!y.requires_grad());
        assert!(gt::debug::get_tape().unwrap().is_empty());
    }
    let y = x.matmul(&w).unwrap().relu().unwrap().sum().unwrap();
    let tape = gt::debug::get_tape().unwrap();
    assert_eq!(tape.iter().map(|e| e.op).collect::<Vec<_>>(), vec!["matmul", "relu", "sum"]);
    let text = gt::debug::format_tape(&tape);
    assert!(text.starts_with("Autograd Tape (3 operations):"), "{text}");
    assert!(text.contains(&format!("= matmul({}, {})", x.id(), w.id())), "{text}");
    y.backward().unwrap();
    assert!(gt::debug::get_tape().unwrap().is_empty(), "backward consumes the graph");
    assert_eq!(gt::debug::format_tape(&[]), "Autograd Tape: Empty (no operations recorded)\n");
}

#[test]
fn module_zero_grad_recurses_and_optimizers_step() {
    let _gt = Runtime::reference();
    gt::manual_seed(1).unwrap();
    let model =
        nn::Sequential::new().push(nn::Linear::new(3, 4).unwrap()).push(nn::ReLU).push(nn::Linear::new(4, 1).unwrap());
    assert_eq!(model.parameters().len(), 4);
    let x = gt::randn(&[5, 3]).unwrap();
    let t = gt::randn(&[5, 1]).unwrap();
    let mut sgd = nn::Sgd::new(model.parameters(), 0.1).with_momentum(0.9);
    let first = nn::mse_loss(&model.forward(&x).unwrap(), &t).unwrap();
    let l0 = first.item().unwrap();
    first.backward().unwrap();
    assert!(model.parameters().iter().all(|p| p.grad().is_some()));
    sgd.step().unwrap();
    model.zero_grad();
    assert!(model.parameters().iter().all(|p| p.grad().is_none()));
    let mut last = l0;
    for _ in 0..20 {
        let l = nn::mse_loss(&model.forward(&x).unwrap(), &t).unwrap();
        last = l.item().unwrap();
        sgd.zero_grad();
        l.backward().unwrap();
        sgd.step().unwrap();
    }
    assert!(last < l0 * 0.8, "SGD with momentum lowers the loss: {l0} -> {last}");
}
