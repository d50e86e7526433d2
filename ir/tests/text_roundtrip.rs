//! Property tests of the text format: `parse(print(p)) == p` for generated programs, and
//! arbitrary bytes never panic the parser or the verifier (plus value walks of generated
//! instructions).

use gt_ir::data::Elements;
use gt_ir::text::{parse, parse_bytes, print};
use gt_ir::*;
use proptest::prelude::*;

fn value() -> impl Strategy<Value = ValueId> + Clone {
    (0u32..8).prop_map(ValueId)
}

fn finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("not nan", |x| !x.is_nan()),
        (-1000i32..1000).prop_map(f64::from),
        Just(0.5),
        Just(-0.0),
    ]
}

fn operand() -> impl Strategy<Value = Operand> {
    prop_oneof![3 => value().prop_map(Operand::Value), 1 => finite_f64().prop_map(Operand::Scalar)]
}

fn ty() -> impl Strategy<Value = TensorType> {
    (prop::sample::select(DType::ALL.to_vec()), prop::collection::vec(0usize..6, 0..4))
        .prop_map(|(d, dims)| TensorType::new(d, dims))
}

/// Up to `n` elements of `dtype` (no NaN: programs compare with `==`).
fn elements(dtype: DType, n: usize) -> BoxedStrategy<Elements> {
    let len = 0..=n;
    match dtype {
        DType::F64 => prop::collection::vec(any::<f64>().prop_filter("not nan", |x| !x.is_nan()), len)
            .prop_map(Elements::F64)
            .boxed(),
        DType::F32 => prop::collection::vec(any::<f32>().prop_filter("not nan", |x| !x.is_nan()), len)
            .prop_map(Elements::F32)
            .boxed(),
        DType::F16 => prop::collection::vec(
            any::<u16>().prop_map(half::f16::from_bits).prop_filter("not nan", |x| !x.is_nan()),
            len,
        )
        .prop_map(Elements::F16)
        .boxed(),
        DType::BF16 => prop::collection::vec(
            any::<u16>().prop_map(half::bf16::from_bits).prop_filter("not nan", |x| !x.is_nan()),
            len,
        )
        .prop_map(Elements::BF16)
        .boxed(),
        DType::I64 => prop::collection::vec(any::<i64>(), len).prop_map(Elements::I64).boxed(),
        DType::I32 => prop::collection::vec(any::<i32>(), len).prop_map(Elements::I32).boxed(),
        DType::Bool => prop::collection::vec(any::<bool>(), len).prop_map(Elements::Bool).boxed(),
    }
}

fn axes() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(any::<i64>(), 0..4)
}

fn slice_item() -> impl Strategy<Value = SliceItem> {
    prop_oneof![
        (any::<Option<i64>>(), any::<Option<i64>>(), any::<i64>()).prop_map(|(start, end, step)| SliceItem::Range {
            start,
            end,
            step
        }),
        any::<i64>().prop_map(SliceItem::Index),
        Just(SliceItem::NewAxis),
        Just(SliceItem::Ellipsis),
    ]
}

fn instr() -> impl Strategy<Value = Instr> {
    prop_oneof![
        (value(), ty(), any::<u64>()).prop_map(|(dst, ty, seed)| Instr::Randn { dst, ty, seed }),
        (value(), ty(), any::<u64>()).prop_map(|(dst, ty, seed)| Instr::Rand { dst, ty, seed }),
        (value(), ty()).prop_map(|(dst, ty)| Instr::Zeros { dst, ty }),
        (value(), ty()).prop_map(|(dst, ty)| Instr::Ones { dst, ty }),
        (value(), ty(), finite_f64()).prop_map(|(dst, ty, value)| Instr::Full { dst, ty, value }),
        (value(), finite_f64(), finite_f64(), finite_f64()).prop_map(|(dst, start, end, step)| Instr::Arange {
            dst,
            dtype: DType::F32,
            start,
            end,
            step
        }),
        (value(), ty())
            .prop_flat_map(|(dst, ty)| (Just(dst), elements(ty.dtype, 6), Just(ty)))
            .prop_map(|(dst, data, ty)| Instr::Literal { dst, ty, data }),
        (value(), value(), prop::sample::select(DType::ALL.to_vec())).prop_map(|(dst, src, dtype)| Instr::Cast {
            dst,
            src,
            dtype
        }),
        (value(), prop::sample::select(UnaryOp::ALL.to_vec()), value()).prop_map(|(dst, op, src)| Instr::Unary {
            dst,
            op,
            src
        }),
        (value(), prop::sample::select(BinaryOp::ALL.to_vec()), operand(), operand())
            .prop_map(|(dst, op, lhs, rhs)| Instr::Binary { dst, op, lhs, rhs }),
        (value(), value(), operand(), operand()).prop_map(|(dst, cond, on_true, on_false)| Instr::Where {
            dst,
            cond,
            on_true,
            on_false
        }),
        (value(), value(), value()).prop_map(|(dst, lhs, rhs)| Instr::MatMul { dst, lhs, rhs }),
        (value(), prop::sample::select(ReduceOp::ALL.to_vec()), value(), prop::option::of(axes()), any::<bool>())
            .prop_map(|(dst, op, src, axes, keepdim)| Instr::Reduce { dst, op, src, axes, keepdim }),
        (value(), value(), any::<i64>(), any::<i64>()).prop_map(|(dst, src, dim0, dim1)| Instr::Transpose {
            dst,
            src,
            dim0,
            dim1
        }),
        (value(), value(), axes()).prop_map(|(dst, src, perm)| Instr::Permute { dst, src, perm }),
        (value(), value(), axes()).prop_map(|(dst, src, shape)| Instr::Reshape { dst, src, shape }),
        (value(), value(), prop::option::of(axes())).prop_map(|(dst, src, axes)| Instr::Squeeze { dst, src, axes }),
        (value(), value(), any::<i64>()).prop_map(|(dst, src, axis)| Instr::Unsqueeze { dst, src, axis }),
        (value(), value(), prop::collection::vec(0usize..1000, 0..4))
            .prop_map(|(dst, src, shape)| Instr::BroadcastTo { dst, src, shape }),
        (value(), prop::collection::vec(value(), 1..4), any::<i64>()).prop_map(|(dst, srcs, axis)| Instr::Concat {
            dst,
            srcs,
            axis
        }),
        (value(), value(), prop::collection::vec(slice_item(), 0..5)).prop_map(|(dst, src, index)| Instr::Slice {
            dst,
            src,
            index
        }),
        (
            prop::collection::vec(value(), 1..4),
            value(),
            any::<i64>(),
            prop_oneof![
                (0usize..9).prop_map(SplitSpec::Size),
                (0usize..9).prop_map(SplitSpec::Chunks),
                prop::collection::vec(0usize..9, 0..4).prop_map(SplitSpec::Sizes),
            ]
        )
            .prop_map(|(dsts, src, axis, spec)| Instr::Split { dsts, src, axis, spec }),
        (
            prop::collection::vec(value(), 1..4),
            prop::collection::vec(value(), 1..4),
            prop_oneof![
                prop::sample::select(ReduceOp::ALL).prop_map(CollectiveOp::AllReduce),
                any::<i64>().prop_map(|axis| CollectiveOp::AllGather { axis }),
                (prop::sample::select(ReduceOp::ALL), any::<i64>())
                    .prop_map(|(op, axis)| CollectiveOp::ReduceScatter { op, axis }),
                Just(CollectiveOp::Broadcast),
                Just(CollectiveOp::Move),
            ]
        )
            .prop_map(|(dsts, mut srcs, op)| {
                if matches!(op, CollectiveOp::Broadcast | CollectiveOp::Move) {
                    srcs.truncate(1);
                }
                Instr::Collective { dsts, op, srcs }
            }),
        value().prop_map(|src| Instr::Free { src }),
        value().prop_map(|src| Instr::GetData { src }),
        any::<u64>().prop_map(|id| Instr::HotPathStart { id }),
        any::<u64>().prop_map(|id| Instr::HotPathEnd { id }),
        (
            "[a-z\" \\\\é]{0,6}",
            any::<bool>(),
            any::<bool>(),
            prop::option::of(prop_oneof![
                (any::<i64>(), prop::collection::vec(any::<u32>(), 0..4))
                    .prop_map(|(axis, workers)| Placement::Split { axis, workers }),
                prop::collection::vec(any::<u32>(), 0..4).prop_map(|workers| Placement::Replicated { workers }),
            ])
        )
            .prop_map(|(name, compile, backward, place)| Instr::SignalStart { name, compile, backward, place }),
        "[a-z_]{0,6}".prop_map(|name| Instr::SignalEnd { name }),
        (value(), ty(), prop::collection::vec(value(), 0..3), prop::sample::select(sample_kernels()))
            .prop_map(|(dst, ty, srcs, kernel)| Instr::Fused { dst, ty, srcs, kernel: Box::new(kernel) }),
    ]
}

/// Kernels of every kind for `fused` (the kernel text itself is property-tested in
/// `gt_ir::kernel::text`).
fn sample_kernels() -> Vec<kernel::Kernel> {
    use kernel::samples;
    vec![
        samples::softmax(&[3, 5]),
        samples::layer_norm(&[2, 7], 1e-5),
        samples::gelu(&[9]),
        samples::linear_relu(4, 5, 6),
    ]
}

fn leaf_stmt() -> impl Strategy<Value = StmtKind> {
    prop_oneof![
        6 => instr().prop_map(StmtKind::Instr),
        1 => value().prop_map(|src| StmtKind::Print { src }),
        1 => (
            value(),
            prop_oneof![Just(Comparison::Exact), (0.0f64..1.0).prop_map(|tol| Comparison::Close { tol })],
            prop::option::of(ty()),
        )
            .prop_flat_map(|(src, cmp, ty)| {
                let data = elements(ty.as_ref().map_or(DType::F64, |t| t.dtype), 5);
                (Just(src), Just(cmp), Just(ty), data)
            })
            .prop_map(|(src, cmp, ty, data)| StmtKind::Expect { src, cmp, ty, data }),
        1 => train().prop_map(StmtKind::Train),
    ]
}

fn train() -> impl Strategy<Value = Train> {
    let values = || prop::collection::vec(value(), 1..4);
    let rate = || 0.0f64..1.0;
    prop_oneof![
        values().prop_map(|values| Train::RequiresGrad { values }),
        values().prop_map(|values| Train::ZeroGrad { values }),
        value().prop_map(|loss| Train::Backward { loss }),
        (value(), value()).prop_map(|(dst, of)| Train::Grad { dst, of }),
        (values(), rate(), rate(), rate()).prop_map(|(params, lr, momentum, weight_decay)| Train::Step {
            optimizer: Optimizer::Sgd { lr, momentum, weight_decay },
            params
        }),
        (values(), rate(), rate(), rate(), rate()).prop_map(|(params, lr, beta1, beta2, eps)| Train::Step {
            optimizer: Optimizer::Adam { lr, beta1, beta2, eps },
            params
        }),
    ]
}

fn stmts() -> impl Strategy<Value = Vec<Stmt>> {
    let leaf = prop::collection::vec(leaf_stmt().prop_map(Stmt::new), 0..6);
    leaf.prop_recursive(3, 40, 6, |inner| {
        prop::collection::vec(
            prop_oneof![
                4 => leaf_stmt().prop_map(Stmt::new),
                1 => (1u64..5, inner.clone()).prop_map(|(count, body)| Stmt::new(StmtKind::Repeat { count, body })),
                1 => ("[a-z\" \\\\é]{0,6}", inner).prop_map(|(name, body)| Stmt::new(StmtKind::Signal { name, body })),
            ],
            0..6,
        )
    })
}

/// Renumbers values densely in order of first appearance in the text, as the parser does.
fn canonical(body: Vec<Stmt>) -> Program {
    fn walk(body: &mut [Stmt], map: &mut Vec<Option<u32>>, names: &mut Vec<String>) {
        fn id(v: &mut ValueId, map: &mut [Option<u32>], names: &mut Vec<String>) {
            let slot = &mut map[v.index()];
            let new = *slot.get_or_insert_with(|| {
                names.push(format!("v{}", v.0));
                names.len() as u32 - 1
            });
            *v = ValueId(new);
        }
        for s in body {
            match &mut s.kind {
                StmtKind::Instr(i) => i.visit_values_mut(&mut |v| id(v, map, names)),
                StmtKind::Print { src } | StmtKind::Expect { src, .. } => id(src, map, names),
                StmtKind::Repeat { body, .. } | StmtKind::Signal { body, .. } => walk(body, map, names),
                StmtKind::Train(t) => t.visit_values_mut(&mut |v| id(v, map, names)),
                StmtKind::Const { .. } => {}
            }
        }
    }
    let mut body = body;
    let mut names = Vec::new();
    walk(&mut body, &mut vec![None; 8], &mut names);
    Program { body, names }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parse_print_round_trips(body in stmts()) {
        let p = canonical(body);
        let text = print(&p);
        let back = parse(&text).map_err(|e| TestCaseError::fail(format!("{e} at {:?} in\n{text}", e.span)))?;
        prop_assert_eq!(back.without_spans(), p, "text was:\n{}", text);
    }

    /// One walk gives what the two separate ones give, for every kind of instruction.
    #[test]
    fn one_walk_agrees_with_results_and_operands_alone(i in instr()) {
        let (mut results, mut operands) = (Vec::new(), Vec::new());
        i.for_each_value(|v, is_result| if is_result { results.push(v) } else { operands.push(v) });
        prop_assert_eq!((&results[..], &operands[..]), (&i.results()[..], &i.operands()[..]));
        let mut each = Vec::new();
        i.for_each_result(|v| each.push(v));
        prop_assert_eq!(&each[..], &i.results()[..]);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(p) = parse_bytes(&bytes) {
            let _ = verify(&p);
            let _ = print(&p);
        }
    }

    #[test]
    fn token_soup_never_panics(words in prop::collection::vec(prop::sample::select(vec![
        "%x", "%y", "=", "add", "matmul", "f32", "[", "]", "{", "}", ",", ":", "-", "1", "2.5", "...", "new",
        "repeat", "signal", "\"s\"", "expect", "~=", "==", "tol=", "axes=", "keepdim", "\n", "const", "n", "slice",
        "split", "size=", "randn", "tensor", "sum", "where", "reshape", "shape=", "-1", "free", "print", "inf", "nan",
    ]), 0..60)) {
        let text = words.join(" ");
        if let Ok(p) = parse(&text) {
            let _ = verify(&p);
            let printed = print(&p);
            prop_assert_eq!(parse(&printed).map(|q| q.without_spans()), Ok(p.without_spans()));
        }
    }
}

#[test]
fn constants_resolve_and_print() {
    let p = parse("const n = 4\nconst s = 0.5\n%x = ones f32[n, 2]\n%y = mul %x, s\n").unwrap();
    let text = print(&p);
    assert_eq!(text, "const n = 4\nconst s = 0.5\n%x = ones f32[4, 2]\n%y = mul %x, 0.5\n");
}

#[test]
fn extreme_integers_round_trip() {
    let src = "%x = randn f32[2] seed=18446744073709551615\n%y = unsqueeze %x axis=-9223372036854775808\n";
    let p = parse(src).unwrap();
    assert_eq!(print(&p), src);
}

/// Found by the fuzzer: `..` once lexed as an empty number token, forever.
#[test]
fn two_dots_are_an_error_not_a_hang() {
    let e = parse("const x = 1..\n").unwrap_err();
    assert!(e.to_string().contains("malformed number"), "{e}");
    assert!(parse("%x = slice %y [..]").is_err());
}

/// Found by review: extreme steps, huge empty dims and long splits must be errors or
/// correct results, never overflow panics or giant allocations.
#[test]
fn extreme_shapes_and_steps_do_not_panic() {
    let src = "%a = zeros f32[3]\n%b = slice %a [::-9223372036854775808]\n%c = slice %a [9223372036854775807:]\n";
    let p = parse(src).unwrap();
    let types = verify(&p).unwrap();
    assert_eq!(types.get(ValueId(1)).unwrap().to_string(), "f32[1]");
    assert_eq!(types.get(ValueId(2)).unwrap().to_string(), "f32[0]");
    let huge_empty = parse("%a = zeros f32[18446744073709551615, 0]\n").unwrap();
    assert!(verify(&huge_empty).unwrap_err().to_string().contains("multiply past 2^40"));
    let long_split = parse("%a = zeros f32[1000000000]\n%b, %c = split %a size=1 axis=0\n").unwrap();
    assert!(verify(&long_split).unwrap_err().to_string().contains("1000000000 pieces"));
    let outer = parse("%a = zeros f32[1099511627776, 1]\n%b = zeros f32[1, 2]\n%c = add %a, %b\n").unwrap();
    assert!(verify(&outer).unwrap_err().to_string().contains("multiply past 2^40"));
}
