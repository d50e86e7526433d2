//! The `gt!` macro: programs written in `.gtir` syntax inside Rust give the same values as the
//! Tensor API methods (and as the same text on the interpreter), gradients flow through them,
//! `{expr}` holes take Rust values, and the code generator rebuilds every instruction variant.
//! Compile errors are tested in `frontend/macros/tests/ui/`.

use gt::ir::{Instr, SliceItem, ValueId};
use gt::{gt, Runtime, Tensor};

type R<T = ()> = anyhow::Result<T>;

/// Deterministic test data: `n` values in about `[-5k, 5k]`.
fn data(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * k).collect()
}

/// Runs `.gtir` text on a fresh reference interpreter and reads `%name`.
fn interpret(src: &str, name: &str) -> Vec<f32> {
    let program = gt::ir::text::parse(src).expect("parses");
    let mut interp = gt::runtime::Interpreter::new();
    for (instr, _) in program.instrs() {
        interp.execute(instr).expect("runs");
    }
    let id = program.names.iter().position(|n| n == name).expect("defined");
    interp.read(ValueId(id as u32)).expect("reads").to_f32()
}

fn range(start: Option<i64>, end: Option<i64>, step: i64) -> SliceItem {
    SliceItem::Range { start, end, step }
}

/// The forward pass of the brief, with `&Tensor` parameters.
fn step(x: &Tensor, w1: &Tensor, b1: &Tensor) -> R<(Tensor, Tensor, Tensor)> {
    gt! {
        %h0 = matmul %x, %w1;
        %h1 = add %h0, %b1;
        %h  = relu %h1;
        %s  = sum %h axes=[1] keepdim;
        %y  = mul %s, 0.5;
        %a, %b = split %h size=2 axis=1;
    }
    let _ = (h0, h1, s);
    Ok((y, a, b))
}

#[test]
fn elementwise_matmul_and_reductions_match_the_methods() -> R {
    let _gt = Runtime::reference();
    let x = gt::from_vec(data(8, 0.3), &[2, 4])?;
    let w1 = gt::from_vec(data(12, 0.1), &[4, 3])?;
    let b1 = gt::tensor(&[0.1, -0.2, 0.3])?;

    let (y, a, b) = step(&x, &w1, &b1)?;
    let h = x.matmul(&w1)?.add(&b1)?.relu()?;
    assert_eq!(y.shape(), &[2, 1]);
    assert_eq!(y.to_vec()?, h.sum_dims(&[1], true)?.mul(0.5)?.to_vec()?);
    let pieces = h.split(2, 1)?;
    assert_eq!((a.shape(), b.shape()), (&[2usize, 2][..], &[2usize, 1][..]));
    assert_eq!(a.to_vec()?, pieces[0].to_vec()?);
    assert_eq!(b.to_vec()?, pieces[1].to_vec()?);

    // Owned `Tensor` variables work as operands too; scalars on either side; every family.
    let h1 = x.matmul(&w1)?.add(&b1)?;
    gt! {
        // Rust comments are allowed; `;` separates statements.
        %m  = mean %h1 axes=[0, -1];
        %mk = max %h1 axes=[0] keepdim;
        %mn = min %h1;
        %t  = transpose %h1;
        %e  = exp %t;
        %lt = lt %h1, 0;
        %c  = where %lt, 1.0, %h1;
        %mx = maximum %h1, -0.1;
        %p  = pow %h1, 2;
        %r  = sub 1, %h1;
        %d  = div %h1, %h1;
        %g  = sigmoid %h1;
        %ef = erf %h1;
        %sp = softplus %h1;
    }
    assert_eq!(m.to_vec()?, h1.mean_dims(&[0, -1], false)?.to_vec()?);
    assert_eq!(mk.shape(), &[1, 3]);
    assert_eq!(mk.to_vec()?, h1.max_dims(&[0], true)?.to_vec()?);
    assert_eq!(mn.to_vec()?, h1.min()?.to_vec()?);
    assert_eq!(e.to_vec()?, h1.t()?.exp()?.to_vec()?);
    assert_eq!(t.shape(), &[3, 2]);
    assert_eq!(c.to_vec()?, gt::where_(&h1.lt(0.0)?, 1.0, &h1)?.to_vec()?);
    assert_eq!(lt.to_vec()?, h1.lt(0.0)?.to_vec()?);
    assert_eq!(mx.to_vec()?, h1.maximum(-0.1)?.to_vec()?);
    assert_eq!(p.to_vec()?, h1.pow(2.0)?.to_vec()?);
    assert_eq!(r.to_vec()?, h1.rsub(1.0)?.to_vec()?);
    assert_eq!(d.to_vec()?, h1.div(&h1)?.to_vec()?);
    assert_eq!(g.to_vec()?, h1.sigmoid()?.to_vec()?);
    // Ops added to the op table reach `gt!` and the methods with no code of their own.
    assert_eq!(ef.to_vec()?, h1.erf()?.to_vec()?);
    assert_eq!(sp.to_vec()?, h1.softplus()?.to_vec()?);

    // A `gt!` value may shadow the Rust variable it reads, as `let x = f(x)` does.
    let z = h1.clone();
    gt! { %z = neg %z; }
    assert_eq!(z.to_vec()?, h1.neg()?.to_vec()?);
    Ok(())
}

#[test]
fn views_slices_and_joins_match_the_methods() -> R {
    let _gt = Runtime::reference();
    let x = gt::from_vec(data(12, 1.0), &[3, 4])?;
    let row = gt::tensor(&[1., 2., 3., 4.])?;
    gt! {
        %v  = reshape %x shape=[2, -1];
        %v3 = reshape %x shape=[3, 2, 2];
        %q  = permute %v3 perm=[2, 0, 1];
        %u  = unsqueeze %x axis=0;
        %sq = squeeze %u axes=[0];
        %sa = squeeze %u;
        %tr = transpose %v3 dim0=0 dim1=2;
        %bc = broadcast_to %row shape=[3, 4];
        %ct = concat %x, %bc, %x axis=1;
        %s1 = slice %x [1:3, ::-1];
        %s2 = slice %x [..., 0];
        %s3 = slice %x [new, -1];
        %s4 = slice %x [::2, 1:];
        %s5 = slice %q [1, ..., -2:];
    }
    assert_eq!((v.shape(), v.to_vec()?), (&[2usize, 6][..], x.reshape(&[2, -1])?.to_vec()?));
    let v3m = x.reshape(&[3, 2, 2])?;
    assert_eq!(q.to_vec()?, v3m.permute(&[2, 0, 1])?.to_vec()?);
    assert_eq!(u.shape(), &[1, 3, 4]);
    assert_eq!(sq.shape(), &[3, 4]);
    assert_eq!(sa.shape(), &[3, 4]);
    assert_eq!(tr.to_vec()?, v3m.transpose(0, 2)?.to_vec()?);
    assert_eq!(bc.to_vec()?, row.broadcast_to(&[3, 4])?.to_vec()?);
    let bcm = row.broadcast_to(&[3, 4])?;
    assert_eq!(ct.to_vec()?, gt::cat(&[&x, &bcm, &x], 1)?.to_vec()?);
    assert_eq!(s1.to_vec()?, x.slice(&[range(Some(1), Some(3), 1), range(None, None, -1)])?.to_vec()?);
    assert_eq!(s2.to_vec()?, x.slice(&[SliceItem::Ellipsis, SliceItem::Index(0)])?.to_vec()?);
    assert_eq!(s3.shape(), &[1, 4]);
    assert_eq!(s3.to_vec()?, x.slice(&[SliceItem::NewAxis, SliceItem::Index(-1)])?.to_vec()?);
    assert_eq!(s4.to_vec()?, x.slice(&[range(None, None, 2), range(Some(1), None, 1)])?.to_vec()?);
    let s5m = v3m.permute(&[2, 0, 1])?.slice(&[SliceItem::Index(1), SliceItem::Ellipsis, range(Some(-2), None, 1)])?;
    assert_eq!(s5.to_vec()?, s5m.to_vec()?);
    Ok(())
}

#[test]
fn split_and_chunk_bind_every_piece() -> R {
    let _gt = Runtime::reference();
    let x = gt::from_vec(data(10, 1.0), &[2, 5])?;
    gt! {
        %a, %b, %c = split %x size=2 axis=1;
        %p, %q = split %x sizes=[1, 4] axis=-1;
        %k0, %k1 = chunk %x chunks=2;
    }
    for (got, want) in [a, b, c].iter().zip(x.split(2, 1)?) {
        assert_eq!((got.shape(), got.to_vec()?), (want.shape(), want.to_vec()?));
    }
    for (got, want) in [p, q].iter().zip(x.split_sizes(&[1, 4], -1)?) {
        assert_eq!((got.shape(), got.to_vec()?), (want.shape(), want.to_vec()?));
    }
    for (got, want) in [k0, k1].iter().zip(x.chunk(2, 0)?) {
        assert_eq!((got.shape(), got.to_vec()?), (want.shape(), want.to_vec()?));
    }
    Ok(())
}

#[test]
fn a_split_into_another_number_of_pieces_is_an_error() {
    let _gt = Runtime::reference();
    let x = gt::from_vec(data(10, 1.0), &[2, 5]).unwrap();
    let run = |size: usize| -> R<Tensor> {
        gt! { %a, %_b = split %x size={size} axis=1; }
        Ok(a)
    };
    assert_eq!(run(3).unwrap().shape(), &[2, 3]);
    let e = run(1).unwrap_err().to_string();
    assert!(e.contains("split") && e.contains("gives 5 results") && e.contains("names 2"), "{e}");
}

#[test]
fn creation_ops_keep_their_seeds_and_data() -> R {
    let _gt = Runtime::reference();
    gt! {
        %r  = randn f32[4, 8] seed=3;
        %r2 = randn f32[4, 8] seed=3;
        %r9 = randn f32[4, 8] seed=9;
        %u  = rand f32[3] seed=7;
        %z  = zeros f32[2, 2];
        %o  = ones f32[3];
        %f  = full f32[2] -1.5;
        %a  = arange f32 start=1 end=7 step=2;
        %t  = tensor f32[2, 2] [[1, 2], [3, -4.5]];
        %s  = tensor f32[] [inf];
    }
    // The same text on the interpreter: the same values (seeds are kept).
    assert_eq!(r.to_vec()?, interpret("%r = randn f32[4, 8] seed=3", "r"));
    assert_eq!(u.to_vec()?, interpret("%u = rand f32[3] seed=7", "u"));
    assert_eq!(r.to_vec()?, r2.to_vec()?);
    assert_ne!(r.to_vec()?, r9.to_vec()?);
    assert_eq!(z.to_vec()?, gt::zeros(&[2, 2])?.to_vec()?);
    assert_eq!(o.to_vec()?, gt::ones(&[3])?.to_vec()?);
    assert_eq!(f.to_vec()?, gt::full(&[2], -1.5)?.to_vec()?);
    assert_eq!(a.to_vec()?, gt::arange(1.0, 7.0, 2.0)?.to_vec()?);
    assert_eq!((t.shape(), t.to_vec()?), (&[2usize, 2][..], vec![1., 2., 3., -4.5]));
    assert_eq!((s.shape(), s.item()?), (&[][..], f32::INFINITY));
    Ok(())
}

#[test]
fn rust_values_in_braces() -> R {
    let _gt = Runtime::reference();
    let x = gt::from_vec(data(6, 1.0), &[2, 3])?;
    let (lr, n, axis, seed, i) = (0.25f32, 3usize, -1i64, 9u64, 1);
    gt! {
        %y  = mul %x, {lr};
        %y2 = mul %x, -{lr};
        %z  = zeros f32[{n}, 2];
        %s  = sum %x axes=[{axis}];
        %r  = randn f32[2] seed={seed};
        %sl = slice %x [{i}:, {i + 1}];
        %t  = tensor f32[2] [{lr}, -{2.0 * lr}];
        %f  = full f32[{n}] {lr * 2.0};
    }
    assert_eq!(y.to_vec()?, x.mul(0.25)?.to_vec()?);
    assert_eq!(y2.to_vec()?, x.mul(-0.25)?.to_vec()?);
    assert_eq!(z.shape(), &[3, 2]);
    assert_eq!(s.to_vec()?, x.sum_dims(&[-1], false)?.to_vec()?);
    assert_eq!(r.to_vec()?, interpret("%r = randn f32[2] seed=9", "r"));
    assert_eq!(sl.to_vec()?, x.slice(&[range(Some(1), None, 1), SliceItem::Index(2)])?.to_vec()?);
    assert_eq!(t.to_vec()?, vec![0.25, -0.5]);
    assert_eq!(f.to_vec()?, vec![0.5; 3]);
    Ok(())
}

#[test]
fn errors_at_run_time_come_back_through_question_mark() {
    let _gt = Runtime::reference();
    let f = |a: &Tensor, b: &Tensor| -> Result<Tensor, gt::TensorError> {
        gt! { %y = matmul %a, %b; }
        Ok(y)
    };
    let a = gt::zeros(&[2, 3]).unwrap();
    let e = f(&a, &a).unwrap_err().to_string();
    assert!(e.starts_with("matmul: "), "{e}");
    assert_eq!(f(&a, &a.t().unwrap()).unwrap().shape(), &[2, 2]);
}

/// `mean(tanh(x @ w + b)^2)`, written with `gt!`.
fn loss_dsl(x: &Tensor, w: &Tensor, b: &Tensor) -> R<Tensor> {
    gt! {
        %h = matmul %x, %w;
        %hb = add %h, %b;
        %a = tanh %hb;
        %s0, %s1 = split %a size=1 axis=1;
        %q = mul %s0, %s1;
        %l = mean %q;
    }
    Ok(l)
}

fn loss_methods(x: &Tensor, w: &Tensor, b: &Tensor) -> R<Tensor> {
    let a = x.matmul(w)?.add(b)?.tanh()?;
    let s = a.split(1, 1)?;
    Ok(s[0].mul(&s[1])?.mean()?)
}

#[test]
fn gradients_flow_through_gt_code() -> R {
    let _gt = Runtime::reference();
    let x = gt::from_vec(data(12, 0.2), &[4, 3])?;
    let leaves = || -> R<(Tensor, Tensor)> {
        Ok((
            gt::from_vec(data(6, 0.1), &[3, 2])?.requires_grad_(true)?,
            gt::tensor(&[0.1, -0.3])?.requires_grad_(true)?,
        ))
    };
    let (w1, b1) = leaves()?;
    let l1 = loss_dsl(&x, &w1, &b1)?;
    l1.backward()?;
    let (w2, b2) = leaves()?;
    let l2 = loss_methods(&x, &w2, &b2)?;
    l2.backward()?;
    assert_eq!(l1.item()?, l2.item()?);
    let grad = |t: &Tensor| t.grad().expect("a gradient").to_vec();
    assert_eq!(grad(&w1)?, grad(&w2)?);
    assert_eq!(grad(&b1)?, grad(&b2)?);
    assert!(grad(&w1)?.iter().any(|g| *g != 0.0));
    Ok(())
}

/// Checks that the code generator rebuilds the parser's instructions exactly.
macro_rules! rebuilds {
    ($text:literal) => {{
        let parsed = gt::ir::text::parse($text).expect("parses");
        let want: Vec<Instr> = parsed.instrs().into_iter().map(|(i, _)| i.clone()).collect();
        let got: Vec<Instr> = gt_macros::gtir_instrs!($text);
        assert_eq!(got, want);
        got.len()
    }};
}

#[test]
fn the_code_generator_rebuilds_every_instruction() {
    let n = rebuilds!(
        r#"
%r = randn f32[2, 3] seed=18446744073709551615
%u = rand f16[0] seed=0
%z = zeros bf16[]
%o = ones i32[1, 2]
%f = full bool[3] -0.0
%g = full f32[3] -inf
%a = arange f32 start=-1.5 end=1e30 step=0.25
%t = tensor f32[2, 2] [1, -2.5, 1e-30, inf]
%ti = tensor i64[3] [-9223372036854775808, 0, 9223372036854775807]
%tj = tensor i32[2] [-2147483648, 7]
%tb = tensor bool[3] [true, false, 1]
%th = tensor f16[2] [65504, -0.5]
%tf = tensor bf16[2] [1e38, 0.1]
%td = tensor f64[2] [1e300, 0.1]
%tc = cast %ti bf16
%n = neg %t
%b = add %t, -3
%c = pow 2, %t
%w = where %t, %n, 0.5
%m = matmul %t, %n
%s = sum %t axes=[0, -9223372036854775808] keepdim
%s2 = max %t
%tr = transpose %t dim0=-3 dim1=9223372036854775807
%p = permute %t perm=[1, 0]
%re = reshape %t shape=[-1]
%sq = squeeze %t axes=[0]
%sq2 = squeeze %t
%us = unsqueeze %t axis=-1
%bt = broadcast_to %t shape=[4, 2, 2]
%ct = concat %t, %n, %b axis=1
%sl = slice %t [1:-1:2, ::-1, 3, new, ...]
%x0, %x1 = split %t size=1 axis=-1
%y0, %y1 = split %t sizes=[1, 1]
%k0, %k1 = chunk %t chunks=2 axis=1
%fu = fused %t, %n : f32[2, 2] kernel map [2, 2] {
  in0 +0 strides [2, 1]
  in1 +0 strides [0, 1]
  %0 = load in0
  %1 = load in1
  %2 = add %0, %1
  out +0 strides [2, 1]
}
free %n
get %t
hotpath_start 7
hotpath_end 18446744073709551615
"#
    );
    assert_eq!(n, 39);
}
