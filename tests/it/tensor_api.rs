//! The Rust Tensor API: ops, errors, views, reads, in-place updates and dropping, on the
//! reference interpreter and on an embedded cluster.

use gt::{s, step, Runtime, Tensor, NEW};

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn arithmetic_broadcasting_and_reads() {
    let _gt = Runtime::reference();
    let a = gt::from_vec(vec![1., 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    let b = gt::tensor(&[10., 20., 30.]).unwrap();
    let c = &a + &b;
    assert_eq!(c.shape(), &[2, 3]);
    assert_eq!(c.to_vec().unwrap(), vec![11., 22., 33., 14., 25., 36.]);
    assert_eq!((2.0 * &a - 1.0).to_vec().unwrap(), vec![1., 3., 5., 7., 9., 11.]);
    assert_eq!((1.0 / gt::tensor(&[2., 4.]).unwrap()).to_vec().unwrap(), vec![0.5, 0.25]);
    assert_eq!((-&b).to_vec().unwrap(), vec![-10., -20., -30.]);
    assert_eq!(a.pow(2.0).unwrap().sum().unwrap().item().unwrap(), 91.0);
    assert_eq!(a.gt(3.0).unwrap().to_vec().unwrap(), vec![0., 0., 0., 1., 1., 1.]);
    assert_eq!(a.sum_dims(&[1], false).unwrap().to_vec().unwrap(), vec![6., 15.]);
    assert_eq!(a.mean_dims(&[0], true).unwrap().shape(), &[1, 3]);
    assert_eq!(a.max().unwrap().item().unwrap(), 6.0);
    assert_eq!(a.to_string(), "f32[2, 3] [[1, 2, 3], [4, 5, 6]]");
    assert!(format!("{a:?}").starts_with("Tensor(%"), "{a:?}");
    let ab = a.matmul(&a.t().unwrap()).unwrap();
    assert_eq!(ab.to_vec().unwrap(), vec![14., 32., 32., 77.]);
}

#[test]
fn errors_name_the_op_and_do_not_panic() {
    let _gt = Runtime::reference();
    let a = gt::zeros(&[2, 3]).unwrap();
    let b = gt::zeros(&[4]).unwrap();
    let e = a.add(&b).unwrap_err().to_string();
    assert!(e.starts_with("add: ") && e.contains("[2, 3]") && e.contains("[4]"), "{e}");
    let e = a.matmul(&b).unwrap_err().to_string();
    assert!(e.starts_with("matmul: "), "{e}");
    let e = a.reshape(&[4, -1]).unwrap_err().to_string();
    assert!(e.starts_with("reshape: "), "{e}");
    assert!(a.item().unwrap_err().to_string().contains("6 elements"));
    assert!(gt::from_vec(vec![1., 2.], &[3]).unwrap_err().to_string().starts_with("tensor: "));
    let e = gt::cat(&[], 0).unwrap_err().to_string();
    assert!(e.starts_with("concat: "), "{e}");
}

#[test]
#[should_panic(expected = "add: ")]
fn operators_panic_with_the_error() {
    let _gt = Runtime::reference();
    let _ = gt::zeros(&[2]).unwrap() + gt::zeros(&[3]).unwrap();
}

#[test]
fn no_runtime_is_an_error() {
    let e = gt::zeros(&[2]).unwrap_err().to_string();
    assert!(e.contains("no gt runtime"), "{e}");
}

#[test]
fn views_slices_and_pieces() {
    let _gt = Runtime::reference();
    let x = gt::arange(0., 24., 1.).unwrap().reshape(&[2, 3, 4]).unwrap();
    assert_eq!(x.permute(&[2, 0, 1]).unwrap().shape(), &[4, 2, 3]);
    assert_eq!(x.slice(&s![1, .., 1..3]).unwrap().to_vec().unwrap(), vec![13., 14., 17., 18., 21., 22.]);
    assert_eq!(x.slice(&s![0, 0, step(.., -2)]).unwrap().to_vec().unwrap(), vec![3., 1.]);
    assert_eq!(x.slice(&s![NEW, -1, 2]).unwrap().shape(), &[1, 4]);
    let parts = x.split(2, 2).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[1].shape(), &[2, 3, 2]);
    let chunks = x.chunk(3, 1).unwrap();
    assert_eq!(chunks.iter().map(|c| c.shape()[1]).collect::<Vec<_>>(), vec![1, 1, 1]);
    let back = gt::cat(&chunks.iter().collect::<Vec<_>>(), 1).unwrap();
    assert_eq!(back.to_vec().unwrap(), x.to_vec().unwrap());
    assert_eq!(x.unsqueeze(0).unwrap().squeeze(0).unwrap().shape(), &[2, 3, 4]);
    let w = gt::where_(&x.gt(10.0).unwrap(), 1.0, &x).unwrap();
    assert_eq!(&w.to_vec().unwrap()[9..13], &[9., 10., 1., 1.]);
}

#[test]
fn in_place_updates_and_seeds() {
    let _gt = Runtime::reference();
    let p = gt::ones(&[3]).unwrap();
    let alias = p.clone();
    p.sub_assign(0.25).unwrap();
    let mut q = alias.clone();
    q -= &gt::tensor(&[0., 1., 2.]).unwrap();
    assert_eq!(p.to_vec().unwrap(), vec![0.75, -0.25, -1.25]);
    assert!(p.sub_assign(&gt::zeros(&[2, 3]).unwrap()).unwrap_err().to_string().contains("keep the type"));
    gt::manual_seed(7).unwrap();
    let a = gt::randn(&[4]).unwrap().to_vec().unwrap();
    let b = gt::randn(&[4]).unwrap().to_vec().unwrap();
    gt::manual_seed(7).unwrap();
    assert_eq!(gt::randn(&[4]).unwrap().to_vec().unwrap(), a);
    assert_ne!(a, b);
}

#[test]
fn embedded_cluster_runs_the_same_and_frees_dropped_tensors() {
    let gt_rt = Runtime::embedded(1).unwrap();
    let x = gt::randn(&[16, 8]).unwrap();
    let w = gt::randn(&[8, 4]).unwrap();
    let y = x.matmul(&w).unwrap().relu().unwrap().sum_dims(&[1], false).unwrap();
    let yv = y.to_vec().unwrap();
    // The same program on the interpreter, with the same seeds.
    let xs = x.to_vec().unwrap();
    let ws = w.to_vec().unwrap();
    let held = |rt: &Runtime| rt.worker_stats().expect("a client").unwrap()[0].live_values;
    let before = held(&gt_rt);
    for _ in 0..50 {
        let t = gt::randn(&[64, 64]).unwrap();
        let u = t.exp().unwrap().add(&t).unwrap();
        drop((t, u));
    }
    gt_rt.sync().unwrap();
    assert_eq!(held(&gt_rt), before, "dropped tensors are freed on the worker");
    let kept: Vec<Tensor> = (0..5).map(|_| gt::zeros(&[2]).unwrap()).collect();
    assert_eq!(held(&gt_rt), before + 5);
    drop(kept);
    drop((x, w, y));
    drop(gt_rt);
    let _r = Runtime::reference();
    let x = gt::from_vec(xs, &[16, 8]).unwrap();
    let w = gt::from_vec(ws, &[8, 4]).unwrap();
    let y = x.matmul(&w).unwrap().relu().unwrap().sum_dims(&[1], false).unwrap();
    assert!(close(&y.to_vec().unwrap(), &yv, 1e-5));
}

#[test]
fn a_late_failure_is_reported_once_and_its_tensor_drops_quietly() {
    let rt = Runtime::embedded(1).unwrap();
    let x = gt::ones(&[2]).unwrap();
    // Over the worker's 8 GiB limit: accepted by the client, refused by the worker.
    let big = gt::zeros(&[65536, 32769]).unwrap();
    let e = x.to_vec().unwrap_err().to_string();
    assert!(e.starts_with("zeros failed") && e.contains("over the limit"), "{e}");
    let e = big.to_vec().unwrap_err().to_string();
    assert!(e.contains("not computed"), "{e}");
    drop(big);
    rt.sync().unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![1.0, 1.0]);
}

#[test]
fn tensors_outliving_their_runtime_fail_cleanly() {
    let rt = Runtime::reference();
    let x = gt::ones(&[2]).unwrap();
    drop(rt);
    let e = x.add(1.0).unwrap_err().to_string();
    assert!(e.contains("shut down"), "{e}");
    drop(x);
}

#[allow(dead_code)]
fn _api_is_usable_by_value(t: Tensor) -> Tensor {
    t.clone() * 2.0 + t
}
