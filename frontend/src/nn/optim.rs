//! Optimizers: they update parameters in place (under `no_grad`) from their gradients, with
//! PyTorch's update rules.

use crate::tensor::{no_grad, Result, Tensor};

/// Updates parameters from their gradients.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;

    /// The parameters it updates.
    fn parameters(&self) -> &[Tensor];

    /// Forgets every parameter's gradient.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }
}

/// Stochastic gradient descent with optional momentum (`v = momentum v + g; p -= lr v`) and
/// weight decay (`g += weight_decay p`).
pub struct Sgd {
    params: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: plain SGD).
    pub momentum: f64,
    /// L2 penalty.
    pub weight_decay: f64,
    velocity: Vec<Option<Tensor>>,
}

impl Sgd {
    /// Plain SGD.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Sgd {
        let velocity = vec![None; params.len()];
        Sgd { params, lr, momentum: 0.0, weight_decay: 0.0, velocity }
    }

    /// With momentum.
    pub fn with_momentum(mut self, momentum: f64) -> Sgd {
        self.momentum = momentum;
        self
    }

    /// With weight decay.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Sgd {
        self.weight_decay = weight_decay;
        self
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let _off = no_grad();
        for (p, v) in self.params.iter().zip(&mut self.velocity) {
            let Some(mut g) = p.grad() else { continue };
            if self.weight_decay != 0.0 {
                g = g.add(&p.detach().mul(self.weight_decay)?)?;
            }
            if self.momentum != 0.0 {
                g = match v.take() {
                    Some(old) => old.mul(self.momentum)?.add(&g)?,
                    None => g,
                };
                // A buffer of its own (PyTorch clones it): zeroing a gradient in place must
                // not zero the momentum.
                *v = Some(g.detach());
            }
            p.sub_assign(&g.mul(self.lr)?)?;
        }
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }
}

/// Adam (Kingma and Ba), with bias correction as in PyTorch.
pub struct Adam {
    params: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first and second moment estimates.
    pub betas: (f64, f64),
    /// Added to the denominator.
    pub eps: f64,
    /// Per parameter: first and second moments and its own step count (a parameter
    /// without a gradient in a step does not advance, as in PyTorch).
    moments: Vec<Option<(Tensor, Tensor, i32)>>,
}

impl Adam {
    /// Adam with betas (0.9, 0.999) and eps 1e-8.
    pub fn new(params: Vec<Tensor>, lr: f64) -> Adam {
        let moments = vec![None; params.len()];
        Adam { params, lr, betas: (0.9, 0.999), eps: 1e-8, moments }
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        let _off = no_grad();
        let (b1, b2) = self.betas;
        for (p, state) in self.params.iter().zip(&mut self.moments) {
            let Some(g) = p.grad() else { continue };
            let g2 = g.mul(&g)?;
            let (m, v, step) = match state.take() {
                Some((m, v, step)) => {
                    (m.mul(b1)?.add(&g.mul(1.0 - b1)?)?, v.mul(b2)?.add(&g2.mul(1.0 - b2)?)?, step + 1)
                }
                None => (g.mul(1.0 - b1)?, g2.mul(1.0 - b2)?, 1),
            };
            let step_size = self.lr / (1.0 - b1.powi(step));
            let correction2 = (1.0 - b2.powi(step)).sqrt();
            let denom = v.sqrt()?.mul(1.0 / correction2)?.add(self.eps)?;
            p.sub_assign(&m.div(&denom)?.mul(step_size)?)?;
            *state = Some((m, v, step));
        }
        Ok(())
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }
}
