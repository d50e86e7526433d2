//! Training a 784-256-10 MLP with the Tensor API and `gt::nn`: a synthetic data set of ten
//! separable classes, cross-entropy, Adam (or SGD with momentum: `-- sgd`).
//! Run: `cargo run --release --example train_mlp`.

use gt::nn::{self, Module, Optimizer};

/// gt's allocator (reuses freed tensor buffers), as gt's own binaries run on.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

fn main() -> anyhow::Result<()> {
    let _gt = gt::init()?;
    gt::manual_seed(42)?;

    // Ten random class centres; each sample is its class centre plus noise.
    let labels: Vec<usize> = (0..64).map(|i| (i * 7) % 10).collect();
    let targets = nn::one_hot(&labels, 10)?;
    let centres = gt::randn(&[10, 784])?;
    let x = targets.matmul(&centres)? + gt::randn(&[64, 784])? * 0.5;

    let model = nn::Sequential::new().push(nn::Linear::new(784, 256)?).push(nn::ReLU).push(nn::Linear::new(256, 10)?);
    let sgd = std::env::args().any(|a| a == "sgd");
    let mut opt: Box<dyn Optimizer> = if sgd {
        Box::new(nn::Sgd::new(model.parameters(), 0.05).with_momentum(0.9))
    } else {
        Box::new(nn::Adam::new(model.parameters(), 1e-3))
    };

    for step in 0..20 {
        let logits = model.forward(&x)?;
        let loss = nn::cross_entropy(&logits, &targets)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        if step % 4 == 0 || step == 19 {
            println!("step {step:>2}: loss {:.6}", loss.item()?);
        }
    }

    // Accuracy: the predicted class is the largest logit.
    let _off = gt::no_grad();
    let logits = model.forward(&x)?;
    let best = logits.max_dims(&[1], true)?;
    let hits = logits.eq(&best)?.mul(&targets)?.sum()?.item()?;
    println!("accuracy: {hits}/64");
    Ok(())
}
