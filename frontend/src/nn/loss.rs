//! Loss functions (means over every element or row, as PyTorch's defaults).

use super::log_softmax;
use crate::tensor::{self, Misuse, Result, Tensor, TensorError};

/// Mean squared error.
pub fn mse_loss(prediction: &Tensor, target: &Tensor) -> Result<Tensor> {
    let d = prediction.sub(target)?;
    d.mul(&d)?.mean()
}

/// Binary cross-entropy of probabilities `p` against targets in `[0, 1]`; the logarithms are
/// clamped at -100 as in PyTorch, so `p` of exactly 0 or 1 gives a finite loss and a finite
/// gradient: `p` is raised to a floor below e^-100 first (the logarithm's gradient would be
/// 0/0 at 0), and its logarithm clamped at -100. (e^-100 itself is a subnormal `f32` a little
/// above e^-100, whose logarithm is -99.98.)
pub fn binary_cross_entropy(p: &Tensor, target: &Tensor) -> Result<Tensor> {
    let floor = 1e-45;
    let clamped_log = |x: Tensor| x.maximum(floor)?.log()?.maximum(-100.0);
    let log_p = clamped_log(p.clone())?;
    let log_q = clamped_log(p.rsub(1.0)?)?;
    let per = target.mul(&log_p)?.add(&target.rsub(1.0)?.mul(&log_q)?)?;
    per.mean()?.neg()
}

/// Binary cross-entropy of `sigmoid(logits)`, computed stably:
/// `max(x, 0) - x t + log(1 + exp(-|x|))`.
pub fn binary_cross_entropy_with_logits(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    let softplus = logits.abs()?.neg()?.exp()?.add(1.0)?.log()?;
    logits.relu()?.sub(&logits.mul(target)?)?.add(&softplus)?.mean()
}

/// Multi-class cross-entropy of `logits` `[N, C]` against target probabilities `[N, C]`
/// (one-hot rows for class labels: [`one_hot`]), through a stable log-softmax; mean over rows.
pub fn cross_entropy(logits: &Tensor, target: &Tensor) -> Result<Tensor> {
    if logits.rank() != 2 || target.shape() != logits.shape() {
        let misuse =
            Misuse::CrossEntropyShapes { logits: Box::new(logits.ty().clone()), target: Box::new(target.ty().clone()) };
        return Err(TensorError::invalid("cross_entropy", misuse));
    }
    log_softmax(logits, -1)?.mul(target)?.sum_dims(&[-1], false)?.mean()?.neg()
}

/// Rows of `classes` values, 1 at each label and 0 elsewhere.
pub fn one_hot(labels: &[usize], classes: usize) -> Result<Tensor> {
    if let Some(bad) = labels.iter().find(|&&l| l >= classes) {
        return Err(TensorError::invalid("one_hot", Misuse::LabelOutOfRange { label: *bad, classes }));
    }
    let mut data = vec![0.0f32; labels.len() * classes];
    for (row, &l) in labels.iter().enumerate() {
        data[row * classes + l] = 1.0;
    }
    tensor::from_vec(data, &[labels.len(), classes])
}
