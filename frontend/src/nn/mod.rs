//! Neural-network building blocks on the Tensor API: the [`Module`] trait, layers
//! ([`Linear`], activations, [`LayerNorm`], [`Sequential`]), functions (softmax, log-softmax,
//! layer norm, GELU), losses ([`loss`]) and optimizers ([`optim`]).

pub mod loss;
pub mod optim;

pub use loss::{binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy, mse_loss, one_hot};
pub use optim::{Adam, Optimizer, Sgd};

use crate::tensor::{self, no_grad, Misuse, Result, Tensor, TensorError};

/// A layer or model: a forward function and the parameters it trains.
pub trait Module {
    /// Applies the module.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Every trainable tensor, submodules' included.
    fn parameters(&self) -> Vec<Tensor> {
        Vec::new()
    }

    /// Forgets the gradients of every parameter, submodules' included.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }
}

/// A trainable leaf made from `init` (computed without recording).
fn parameter(init: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    let value = {
        let _off = no_grad();
        init()?
    };
    value.requires_grad_(true)
}

/// `x @ weight + bias`, with `weight` of shape `[in, out]` (the Python GT's layout) and both
/// initialised uniformly in `±1/sqrt(in)` (PyTorch's default).
pub struct Linear {
    /// `[in, out]`.
    pub weight: Tensor,
    /// `[out]`, when the layer has one.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer with a bias.
    pub fn new(inputs: usize, outputs: usize) -> Result<Linear> {
        Linear::with_bias(inputs, outputs, true)
    }

    /// A layer with or without a bias.
    pub fn with_bias(inputs: usize, outputs: usize, bias: bool) -> Result<Linear> {
        let bound = 1.0 / (inputs.max(1) as f64).sqrt();
        let uniform = |shape: &[usize]| tensor::rand(shape)?.mul(2.0 * bound)?.sub(bound);
        let weight = parameter(|| uniform(&[inputs, outputs]))?;
        let bias = if bias { Some(parameter(|| uniform(&[outputs]))?) } else { None };
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    fn parameters(&self) -> Vec<Tensor> {
        std::iter::once(self.weight.clone()).chain(self.bias.clone()).collect()
    }
}

/// Layer normalisation over the last axes (as many as its normalized shape has) with a
/// learned scale and shift, as PyTorch's `LayerNorm(normalized_shape)`.
pub struct LayerNorm {
    /// Scale, the normalized shape, initially ones.
    pub weight: Tensor,
    /// Shift, the normalized shape, initially zeros.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A layer norm over the last axis, of `features` values (eps 1e-5).
    pub fn new(features: usize) -> Result<LayerNorm> {
        LayerNorm::over(&[features])
    }

    /// A layer norm over the last axes, of shape `normalized` (eps 1e-5).
    pub fn over(normalized: &[usize]) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: parameter(|| tensor::ones(normalized))?,
            bias: parameter(|| tensor::zeros(normalized))?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let normalized = self.weight.shape();
        if !x.shape().ends_with(normalized) {
            let misuse = Misuse::NormalizedShape { normalized: normalized.to_vec(), input: x.shape().to_vec() };
            return Err(TensorError::invalid("LayerNorm", misuse));
        }
        layer_norm_over(x, normalized.len(), self.eps)?.mul(&self.weight)?.add(&self.bias)
    }

    fn parameters(&self) -> Vec<Tensor> {
        vec![self.weight.clone(), self.bias.clone()]
    }
}

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => $f:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                let f: fn(&Tensor) -> Result<Tensor> = $f;
                f(x)
            }
        }
    )*};
}

activation! {
    /// `max(x, 0)`.
    ReLU => |x| x.relu();
    /// The logistic function.
    Sigmoid => |x| x.sigmoid();
    /// Hyperbolic tangent.
    Tanh => |x| x.tanh();
    /// GELU, exact (PyTorch's default).
    GELU => gelu;
}

/// Softmax over an axis, as a layer.
#[derive(Debug, Clone, Copy)]
pub struct Softmax(pub i64);

impl Module for Softmax {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        softmax(x, self.0)
    }
}

/// Modules applied in order.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// No layers yet.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends a layer.
    pub fn push(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// How many layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether it has no layers (the identity).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for layer in &self.layers {
            y = layer.forward(&y)?;
        }
        Ok(y)
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }
}

/// `x` less its maximum over `axis`, which changes neither softmax nor log-softmax but keeps
/// `exp` finite (so it needs no gradient); `x` itself where it has no elements (an empty
/// axis has no maximum, and an empty result needs no shift).
fn shifted(x: &Tensor, axis: i64) -> Result<Tensor> {
    if x.numel() == 0 {
        return x.mul(1.0);
    }
    let m = {
        let _off = no_grad();
        x.detach().max_dims(&[axis], true)?
    };
    x.sub(&m)
}

/// `log(softmax(x))` over `axis`, computed stably (`x - max - log(sum(exp(x - max)))`).
pub fn log_softmax(x: &Tensor, axis: i64) -> Result<Tensor> {
    let z = shifted(x, axis)?;
    let lse = z.exp()?.sum_dims(&[axis], true)?.log()?;
    z.sub(&lse)
}

/// Softmax over `axis`, stabilised by subtracting the maximum.
pub fn softmax(x: &Tensor, axis: i64) -> Result<Tensor> {
    let e = shifted(x, axis)?.exp()?;
    let s = e.sum_dims(&[axis], true)?;
    e.div(&s)
}

/// `(x - mean) / sqrt(var + eps)` over the last axis (biased variance, as PyTorch).
pub fn layer_norm(x: &Tensor, eps: f64) -> Result<Tensor> {
    layer_norm_over(x, 1, eps)
}

/// [`layer_norm`] over the last `axes` axes together (PyTorch's `normalized_shape` of that
/// many dims).
pub fn layer_norm_over(x: &Tensor, axes: usize, eps: f64) -> Result<Tensor> {
    let last: Vec<i64> = (1..=axes as i64).rev().map(|a| -a).collect();
    let centred = x.sub(&x.mean_dims(&last, true)?)?;
    let var = centred.mul(&centred)?.mean_dims(&last, true)?;
    centred.mul(&var.add(eps)?.rsqrt()?)
}

/// GELU, exact: `0.5 x (1 + erf(x / sqrt 2))`, PyTorch's default (`gelu_tanh` is the
/// approximation).
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    x.mul(std::f64::consts::FRAC_1_SQRT_2)?.erf()?.add(1.0)?.mul(x)?.mul(0.5)
}

/// GELU, tanh approximation (PyTorch's `approximate="tanh"`):
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let inner = x.mul(x)?.mul(x)?.mul(0.044715)?.add(x)?.mul((2.0 / std::f64::consts::PI).sqrt())?;
    inner.tanh()?.add(1.0)?.mul(x)?.mul(0.5)
}
