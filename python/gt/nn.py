"""Neural networks (the Python GT's `gt.nn` and `gt.client.nn`): `Module`, layers, losses and
the optimizers `SGD` and `Adam` (the Rust ones: updates run under no_grad, as PyTorch's)."""

import numpy as np

from . import _gt
from ._gt import SGD, Adam, Tensor, binary_cross_entropy, binary_cross_entropy_with_logits, gelu, mse_loss

__all__ = [
    "Module",
    "Linear",
    "Sequential",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "GELU",
    "Softmax",
    "LayerNorm",
    "SGD",
    "Adam",
    "mse_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cross_entropy",
    "cross_entropy_loss",
    "relu",
    "sigmoid",
    "tanh",
    "gelu",
    "softmax",
    "log_softmax",
    "layer_norm",
]


class Module:
    """A layer or model. Tensors that require grad and modules assigned as attributes are
    its parameters and submodules; `parameters()` and `zero_grad()` reach every level."""

    def __init__(self):
        object.__setattr__(self, "_parameters", [])
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            Module.__init__(self)
        # A reassigned attribute stops being what it was.
        old = self.__dict__.get(name)
        if old is not None:
            self._parameters[:] = [p for p in self._parameters if p is not old]
            self._modules.pop(name, None)
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Tensor) and value.requires_grad and value.is_leaf:
            self._parameters.append(value)
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def children(self):
        return list(self.__dict__.get("_modules", {}).values())

    def modules(self):
        out = [self]
        for m in self.children():
            out.extend(m.modules())
        return out

    def parameters(self):
        """Every parameter, submodules' included (each once)."""
        seen, out = set(), []
        for m in self.modules():
            for p in m.__dict__.get("_parameters", []):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def named_parameters(self, prefix=""):
        out = []
        for name, value in self.__dict__.items():
            if isinstance(value, Tensor) and any(value is p for p in self.__dict__.get("_parameters", [])):
                out.append((prefix + name, value))
        for name, m in self.__dict__.get("_modules", {}).items():
            out.extend(m.named_parameters(prefix + name + "."))
        return out

    def zero_grad(self):
        """Forgets every parameter's gradient (submodules' too)."""
        for p in self.parameters():
            p.grad = None

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def state_dict(self):
        """Parameter values as NumPy arrays, by dotted name."""
        return {name: p.numpy() for name, p in self.named_parameters()}

    def load_state_dict(self, state):
        """Takes parameter values (arrays or tensors) by dotted name."""
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise KeyError(f"load_state_dict: no value for {', '.join(missing)}")
        from ._api import tensor

        with _no_grad():
            for name, p in params.items():
                v = tensor(np.asarray(state[name]), dtype=p.dtype)
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"load_state_dict: {name} has shape {tuple(p.shape)}, got {tuple(v.shape)}")
                p.zero_()
                p += v


def _no_grad():
    from ._api import no_grad

    return no_grad()


class Linear(Module):
    """`x @ weight + bias`, weight `[in_features, out_features]` (the Python GT's layout),
    both uniform in ±1/sqrt(in_features) (PyTorch's default)."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        w, b = _gt._linear_init(in_features, out_features, bool(bias))
        self.weight = w
        self.bias = b

    def forward(self, x):
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y

    def __repr__(self):
        return f"Linear(in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None})"


class Sequential(Module):
    """Modules applied in order."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = list(layers)
        for i, layer in enumerate(self.layers):
            self._modules[str(i)] = layer

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class Sigmoid(Module):
    def forward(self, x):
        return x.sigmoid()


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class GELU(Module):
    """GELU, exact (PyTorch's default) or with `approximate="tanh"` its tanh approximation."""

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return gelu(x, self.approximate)


class Softmax(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.softmax(self.dim)


class LayerNorm(Module):
    """Normalisation over the last axes, of `normalized_shape` (an int or a tuple, as
    PyTorch's), with a learned scale and shift of that shape."""

    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        from ._api import ones, zeros

        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape = shape
        self.eps = eps
        self.weight = ones(shape, requires_grad=True)
        self.bias = zeros(shape, requires_grad=True)

    def forward(self, x):
        n = len(self.normalized_shape)
        if tuple(x.shape[len(x.shape) - n :]) != self.normalized_shape or len(x.shape) < n:
            raise ValueError(
                f"LayerNorm: normalizes over the last axes of shape {list(self.normalized_shape)}, "
                f"but the input has shape {list(x.shape)}"
            )
        return _gt._layer_norm(x, self.eps, n) * self.weight + self.bias


def relu(x):
    return x.relu()


def sigmoid(x):
    return x.sigmoid()


def tanh(x):
    return x.tanh()


def softmax(x, dim=-1):
    return x.softmax(dim)


def log_softmax(x, dim=-1):
    return x.log_softmax(dim)


def layer_norm(x, eps=1e-5):
    return _gt._layer_norm(x, eps)


def cross_entropy(logits, target):
    """Softmax cross-entropy of `[N, C]` logits against class indices `[N]` (a list, an
    array or an integer tensor) or target probabilities `[N, C]`; mean over rows."""
    if not isinstance(target, Tensor) or target.dtype in ("int32", "int64"):
        labels = np.asarray(target.numpy() if isinstance(target, Tensor) else target)
        if labels.ndim != 1 or labels.dtype.kind not in "iu":
            raise ValueError(f"cross_entropy: class targets must be a 1-d list of ints, got shape {labels.shape}")
        if (labels < 0).any():
            raise ValueError(f"cross_entropy: class {int(labels.min())} is negative")
        target = _gt._one_hot([int(v) for v in labels], int(logits.shape[-1]))
    return _gt._cross_entropy(logits, target)


def cross_entropy_loss(logits, target):
    """The Python GT's name. With one logit per row it is binary (its only case: binary
    cross-entropy of the sigmoid); with more it is softmax cross-entropy, as PyTorch's."""
    if logits.shape and logits.shape[-1] == 1:
        return binary_cross_entropy_with_logits(logits, target)
    return cross_entropy(logits, target)
