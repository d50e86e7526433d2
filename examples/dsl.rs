//! A tiny MLP (4-16-1) whose forward pass and loss are written with the `gt!` macro (tensor
//! programs in `.gtir` syntax, lowered to IR instructions at compile time), trained with
//! `gt::nn::Sgd` on an embedded cluster: autograd records what `gt!` runs.
//! Run: `cargo run --example dsl`. The syntax is in `docs/dsl.md`.

use gt::nn::{Optimizer, Sgd};
use gt::Tensor;

/// The parameters of `relu(x w1 + b1) w2 + b2`.
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Mlp {
    /// Small random weights and zero biases, made in `gt!` with fixed seeds.
    fn new(scale: f64) -> anyhow::Result<Mlp> {
        gt::gt! {
            %w1r = randn f32[4, 16] seed=10;
            %w1  = mul %w1r, {scale};
            %w2r = randn f32[16, 1] seed=11;
            %w2  = mul %w2r, {scale};
            %b1  = zeros f32[16];
            %b2  = zeros f32[1];
        }
        let leaf = |t: Tensor| t.requires_grad_(true);
        Ok(Mlp { w1: leaf(w1)?, b1: leaf(b1)?, w2: leaf(w2)?, b2: leaf(b2)? })
    }

    /// Mean squared error of the prediction for `x` against `y`.
    fn loss(&self, x: &Tensor, y: &Tensor) -> anyhow::Result<Tensor> {
        let Mlp { w1, b1, w2, b2 } = self;
        gt::gt! {
            %h0 = matmul %x, %w1;
            %h1 = add %h0, %b1;
            %h  = relu %h1;
            %o0 = matmul %h, %w2;
            %o  = add %o0, %b2;
            %d  = sub %o, %y;
            %d2 = mul %d, %d;
            %l  = mean %d2;
        }
        Ok(l)
    }
}

fn main() -> anyhow::Result<()> {
    let _gt = gt::Runtime::embedded(1)?;

    // A smooth target: y = tanh(x w*) for a fixed random w*.
    gt::gt! {
        %x  = randn f32[64, 4] seed=1;
        %ws = randn f32[4, 1] seed=2;
        %xw = matmul %x, %ws;
        %y  = tanh %xw;
    }

    let model = Mlp::new(0.5)?;
    let mut opt = Sgd::new(vec![model.w1.clone(), model.b1.clone(), model.w2.clone(), model.b2.clone()], 0.1);
    let steps = 60;
    let mut first = None;
    for step in 0..=steps {
        let loss = model.loss(&x, &y)?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        if step % 10 == 0 {
            let l = loss.item()?;
            first.get_or_insert(l);
            println!("step {step:>3}: loss {l:.5}");
        }
    }
    let last = model.loss(&x, &y)?.item()?;
    println!("loss {:.5} -> {last:.5}", first.unwrap_or(last));
    Ok(())
}
