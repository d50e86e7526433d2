//! Training with the Tensor API: a 784-256-10 MLP on a separable synthetic data set reaches a
//! stated loss with SGD (momentum) and with Adam, on the reference interpreter and on an
//! embedded cluster (the same losses step by step).

use gt::nn::{self, Module, Optimizer};
use gt::{Runtime, Tensor};

const BATCH: usize = 64;
const CLASSES: usize = 10;

/// Inputs near one of ten random centres, and the one-hot labels.
fn data() -> (Tensor, Tensor) {
    let labels: Vec<usize> = (0..BATCH).map(|i| (i * 7) % CLASSES).collect();
    let onehot = nn::one_hot(&labels, CLASSES).unwrap();
    let centres = gt::randn(&[CLASSES, 784]).unwrap();
    let noise = gt::randn(&[BATCH, 784]).unwrap().mul(0.5).unwrap();
    (onehot.matmul(&centres).unwrap().add(&noise).unwrap(), onehot)
}

fn mlp() -> nn::Sequential {
    nn::Sequential::new()
        .push(nn::Linear::new(784, 256).unwrap())
        .push(nn::ReLU)
        .push(nn::Linear::new(256, CLASSES).unwrap())
}

/// Losses of `steps` steps of full-batch training.
fn train(adam: bool, steps: usize) -> Vec<f32> {
    gt::manual_seed(42).unwrap();
    let (x, t) = data();
    let model = mlp();
    let mut opt: Box<dyn Optimizer> = if adam {
        Box::new(nn::Adam::new(model.parameters(), 1e-3))
    } else {
        Box::new(nn::Sgd::new(model.parameters(), 0.05).with_momentum(0.9))
    };
    (0..steps)
        .map(|_| {
            let loss = nn::cross_entropy(&model.forward(&x).unwrap(), &t).unwrap();
            opt.zero_grad();
            loss.backward().unwrap();
            opt.step().unwrap();
            loss.item().unwrap()
        })
        .collect()
}

#[test]
fn mlp_learns_with_sgd_and_adam() {
    let _gt = Runtime::reference();
    for adam in [false, true] {
        let losses = train(adam, 15);
        let (first, last) = (losses[0], *losses.last().unwrap());
        assert!(first > 1.5, "an untrained 10-class model starts near ln 10: {first}");
        assert!(last < 0.05, "{} reaches a loss below 0.05 in 15 steps: {losses:?}", if adam { "Adam" } else { "SGD" });
    }
}

/// Losses of SGD steps with the forward pass in `dtype` under autocast (`None`: f32), or
/// in a signal whose config says `dtype: bf16` (`signal`).
fn train_mixed(dtype: Option<gt::DType>, signal: bool, steps: usize) -> (Vec<f32>, gt::DType) {
    gt::manual_seed(42).unwrap();
    let (x, t) = data();
    let model = mlp();
    let mut opt = nn::Sgd::new(model.parameters(), 0.05).with_momentum(0.9);
    let mut logits_dtype = gt::DType::F32;
    let losses = (0..steps)
        .map(|_| {
            let loss = {
                let _scope = match (dtype, signal) {
                    (Some(d), false) => (Some(gt::autocast(d).unwrap()), None),
                    (_, true) => (None, Some(gt::signal::context("mixed").unwrap())),
                    _ => (None, None),
                };
                let logits = model.forward(&x).unwrap();
                logits_dtype = logits.dtype();
                nn::cross_entropy(&logits, &t).unwrap()
            };
            opt.zero_grad();
            loss.backward().unwrap();
            opt.step().unwrap();
            loss.item().unwrap()
        })
        .collect();
    // Master weights stay f32.
    assert!(model.parameters().iter().all(|p| p.dtype() == gt::DType::F32));
    (losses, logits_dtype)
}

/// Mixed precision: the MLP's forward pass in bf16 (matmuls and arithmetic; exp, log and
/// reductions in f32) with f32 master weights gives the f32 run's loss at every one of 15
/// steps within 2% (+1e-4); a signal config's `dtype: bf16` does the same as the guard.
#[test]
fn an_mlp_trained_under_bf16_autocast_reaches_the_f32_loss() {
    let _gt = Runtime::reference();
    let (f32_losses, d) = train_mixed(None, false, 15);
    assert_eq!(d, gt::DType::F32);
    let (bf16_losses, d) = train_mixed(Some(gt::DType::BF16), false, 15);
    assert_eq!(d, gt::DType::BF16, "the logits come out of a bf16 matmul");
    assert!(bf16_losses[0] > 1.5 && bf16_losses[14] < 1e-3, "bf16 learns: {bf16_losses:?}");
    for (a, b) in f32_losses.iter().zip(&bf16_losses) {
        assert!((a - b).abs() <= 0.02 * a + 1e-4, "f32 {f32_losses:?}\nbf16 {bf16_losses:?}");
    }
    assert_ne!(bf16_losses, f32_losses, "bf16 rounds differently");
    let config = gt::config::SignalConfig { dtype: Some(gt::DType::BF16), ..Default::default() };
    gt::signal::register_config("mixed", config);
    let (signal_losses, d) = train_mixed(None, true, 15);
    assert_eq!(d, gt::DType::BF16);
    assert_eq!(signal_losses, bf16_losses);
    // Only halves (and f32, off) are autocast dtypes.
    let e = gt::autocast(gt::DType::I32).unwrap_err().to_string();
    assert!(e.contains("takes bf16, f16 or f32 (off), not i32"), "{e}");
}

#[test]
fn embedded_cluster_gives_the_interpreters_losses() {
    let reference = {
        let _gt = Runtime::reference();
        train(true, 5)
    };
    let embedded = {
        let _gt = Runtime::embedded(1).unwrap();
        train(true, 5)
    };
    for (a, b) in reference.iter().zip(&embedded) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{reference:?} vs {embedded:?}");
    }
}

/// The losses of examples/train_mlp.gtir, step by step, read at full precision.
fn gtir_losses() -> Vec<f32> {
    struct Reads<E> {
        inner: E,
        values: Vec<f32>,
    }
    impl<E: gt::ir::Executor> gt::ir::Executor for Reads<E> {
        type Error = E::Error;
        fn error_kind(error: &E::Error) -> gt::ir::FailureKind {
            E::error_kind(error)
        }
        fn execute(&mut self, instr: &gt::ir::Instr) -> Result<(), E::Error> {
            self.inner.execute(instr)
        }
        fn read(&mut self, v: gt::ir::ValueId) -> Result<gt::ir::HostTensor, E::Error> {
            let t = self.inner.read(v)?;
            self.values.extend(&t.to_f32());
            Ok(t)
        }
        fn train(
            &mut self,
            stmt: &gt::ir::Train,
            site: usize,
            span: Option<gt::ir::Span>,
        ) -> Option<Result<(), E::Error>> {
            self.inner.train(stmt, site, span)
        }
    }
    let source = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/train_mlp.gtir")).unwrap();
    let loaded = gt::script::load(&source).unwrap();
    let exec = gt::frontend::tensor::TensorExecutor::new(gt::runtime::Interpreter::new());
    let mut reads = Reads { inner: exec, values: Vec::new() };
    gt::frontend::run_script(&loaded.program, &mut reads, &mut std::io::sink(), Default::default()).unwrap();
    reads.values
}

/// The same program with the Tensor API; `dsl` writes the forward pass with `gt!`.
fn api_losses(dsl: bool) -> Vec<f32> {
    let _gt = Runtime::reference();
    let run = || -> anyhow::Result<Vec<f32>> {
        let x = gt::randn_seeded(&[64, 784], 1)?;
        let y = gt::randn_seeded(&[64, 10], 2)?;
        let w1 = gt::randn_seeded(&[784, 256], 3)?.mul(0.05)?.requires_grad_(true)?;
        let w2 = gt::randn_seeded(&[256, 10], 4)?.mul(0.05)?.requires_grad_(true)?;
        let mut sgd = nn::Sgd::new(vec![w1.clone(), w2.clone()], 0.05);
        let mut losses = Vec::new();
        for _ in 0..20 {
            let loss = if dsl {
                gt::gt! {
                    %h0 = matmul %x, %w1;
                    %h = relu %h0;
                    %p = matmul %h, %w2;
                    %d = sub %p, %y;
                    %sq = mul %d, %d;
                    %loss = mean %sq;
                }
                loss
            } else {
                let h = x.matmul(&w1)?.relu()?;
                let d = h.matmul(&w2)?.sub(&y)?;
                d.mul(&d)?.mean()?
            };
            loss.backward()?;
            sgd.step()?;
            sgd.zero_grad();
            losses.push(loss.item()?);
        }
        Ok(losses)
    };
    run().unwrap()
}

#[test]
fn rust_api_gt_macro_and_gtir_give_the_same_losses_step_by_step() {
    let gtir = gtir_losses();
    assert_eq!(gtir.len(), 20);
    assert!(gtir[19] < gtir[0] * 0.2, "the script trains: {gtir:?}");
    assert_eq!(api_losses(false), gtir, "Rust API vs .gtir");
    assert_eq!(api_losses(true), gtir, "gt! vs .gtir");
}
