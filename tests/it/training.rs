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
