"""Making tensors from Python data: dtype names, NumPy conversion, creation functions."""

import builtins
import functools
import inspect

import numpy as np

from . import _gt
from ._gt import Tensor

# NumPy kinds gt holds as they are, and the small integer types it widens without loss.
_NATIVE = {
    "float64": "float64",
    "float32": "float32",
    "float16": "float16",
    "int64": "int64",
    "int32": "int32",
    "bool": "bool",
    "int8": "int32",
    "int16": "int32",
    "uint8": "int32",
    "uint16": "int32",
    "uint32": "int64",
}
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "bool")
FLOATS = ("float64", "float32", "float16", "bfloat16")
# The values each integer dtype holds, [low, high).
_INT_RANGES = {"int32": (-(2**31), 2**31), "int64": (-(2**63), 2**63)}


def _dtype(dtype):
    """The canonical name of a dtype argument (`gt.float32`, "f32", np.float16, float, ...)."""
    if dtype is None:
        return None
    name = _gt._dtype_name(dtype)
    if name not in DTYPES:
        if name in _NATIVE:
            raise TypeError(
                f"dtype {name}: gt has {', '.join(DTYPES)}; convert with .astype() (e.g. to int32) first"
            )
        raise TypeError(f"unknown dtype {dtype!r}: gt has {', '.join(DTYPES)}")
    return name


def _is_dtype(obj):
    try:
        _dtype(obj)
        return True
    except (TypeError, ValueError):
        return False


def _leaves(data):
    """The types of the numbers in nested lists and tuples (an array among them counts as its
    dtype's scalar type), and the Python ints among them beyond int64."""
    low, high = _INT_RANGES["int64"]
    types, big = set(), []
    todo = [data]
    while todo:
        x = todo.pop()
        if isinstance(x, (list, tuple)):
            kinds = set(map(type, x))
            if any(issubclass(k, (list, tuple, np.ndarray)) for k in kinds):
                todo.extend(x)
                continue
            types |= kinds
            if int in kinds:
                big.extend(v for v in x if type(v) is int and not low <= v < high)
        elif isinstance(x, np.ndarray):
            types.add(x.dtype.type)
        else:
            types.add(type(x))
            if type(x) is int and not low <= x < high:
                big.append(x)
    return types, big


def _float_dtype(types):
    """PyTorch's dtype for data with floats of these types: a Python float counts as float32
    (the default dtype), a NumPy float scalar as its own dtype (np.float64 is a float too)."""
    dtypes = [np.dtype(t) for t in types if issubclass(t, np.floating)]
    if float in types or not dtypes:
        dtypes.append(np.dtype(np.float32))
    return np.result_type(*dtypes)


def _check_integers(a, want):
    """Refuses values an integer dtype cannot hold (NumPy would wrap them, or make NaN the
    lowest int), as PyTorch and `gt.full` refuse them."""
    if want not in _INT_RANGES or a.size == 0 or a.dtype.kind not in "fiu":
        return
    low, high = _INT_RANGES[want]
    if a.dtype.kind == "f":
        # (In float64, which holds both bounds exactly.)
        wide = a.astype(np.float64, copy=False)
        bad = ~np.isfinite(wide) | (wide < low) | (wide >= high)
    elif int(a.min()) < low or int(a.max()) >= high:
        bad = (a < low) | (a > high - 1)
    else:
        return
    if bad.any():
        from . import GtValueError

        value = a[bad].flat[0]
        why = "not finite" if a.dtype.kind == "f" and not np.isfinite(value) else f"beyond the {want} range"
        raise GtValueError(f"tensor: {value.item()!r} is not an {want} element: {why}")


def _array(data, dtype=None):
    """`data` as a C-contiguous, native-order NumPy array of a gt dtype, and that dtype's name."""
    want = _dtype(dtype)
    if isinstance(data, np.ndarray):
        a = data
    else:
        a = np.asarray(data)
        if a.dtype.kind in "fuO":
            # Floats, ints NumPy holds as uint64 (or as objects), or both: PyTorch's dtype
            # and range checks need the Python numbers' own types.
            types, big = _leaves(data)
            floats = any(issubclass(t, (float, np.floating)) for t in types)
            if big and not (want in FLOATS if want else floats):
                raise OverflowError(
                    f"tensor: {big[0]} is beyond the int64 range, which gt (as PyTorch) takes Python ints in"
                )
            if want is None and floats:
                # Python floats make float32 tensors, as in PyTorch (NumPy would say float64).
                a = a.astype(_float_dtype(types))
            elif a.dtype.kind == "O" and big:
                a = np.asarray(data, dtype=np.float64)
    if a.dtype.kind not in "fiub":
        raise TypeError(
            f"cannot make a tensor of NumPy dtype {a.dtype} (from {type(data).__name__}): "
            f"gt has {', '.join(DTYPES)}"
        )
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if want is None:
        name = _NATIVE.get(a.dtype.name)
        if name is None:
            raise TypeError(
                f"NumPy dtype {a.dtype} has no gt dtype without loss (gt has {', '.join(DTYPES)}); "
                "convert it with .astype() first"
            )
        want = name
    carrier = "float32" if want == "bfloat16" else want
    _check_integers(a, want)
    if a.dtype.name != carrier:
        a = a.astype(carrier)
    if not a.flags.c_contiguous:
        # (ascontiguousarray would make a 0-d array 1-d.)
        a = a.copy(order="C")
    return a, want


def _shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return [int(d) for d in shape]


def tensor(data, dtype=None, requires_grad=False):
    """A tensor of `data` (a number, nested lists, or a NumPy array). Without `dtype`, Python
    floats give float32, ints int64 and bools bool (PyTorch's rule); an array keeps its dtype."""
    if isinstance(data, Tensor):
        # A copy outside the autograd graph, as PyTorch's (a leaf, tracked only if asked).
        t = data.detach()
        t = t.to(dtype) if dtype is not None else t.clone()
        return t.requires_grad_(True) if requires_grad else t
    a, name = _array(data, dtype)
    return _gt._from_array(a, name, requires_grad)


def from_numpy(array, requires_grad=False):
    """A tensor of a NumPy array's values, in its dtype (one copy, no Python loop)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    a, name = _array(array)
    return _gt._from_array(a, name, requires_grad)


def _as_tensor(obj):
    """The other operand of an operator, when it is a list or an array."""
    return tensor(obj)


def _float_only(fn, dtype):
    """`dtype` as a name, refused unless it is a float (random numbers of an integer dtype
    would be truncated ones, which PyTorch refuses too)."""
    name = _dtype(dtype)
    if name not in FLOATS:
        from . import GtValueError

        raise GtValueError(f"{fn}: takes a float dtype ({', '.join(FLOATS)}), not {name}")
    return name


def randn(*shape, dtype="float32", requires_grad=False):
    """Standard normal samples."""
    return _gt._randn(_shape(shape), _float_only("randn", dtype), requires_grad)


def rand(*shape, dtype="float32", requires_grad=False):
    """Uniform samples in [0, 1)."""
    return _gt._rand(_shape(shape), _float_only("rand", dtype), requires_grad)


def zeros(*shape, dtype="float32", requires_grad=False):
    """Zeros."""
    return _gt._full(_shape(shape), 0.0, _dtype(dtype), requires_grad)


def ones(*shape, dtype="float32", requires_grad=False):
    """Ones."""
    return _gt._full(_shape(shape), 1.0, _dtype(dtype), requires_grad)


def full(shape, fill_value, dtype=None, requires_grad=False):
    """Every element `fill_value` (dtype: float32 for a float, int64 for an int)."""
    if dtype is None:
        dtype = "bool" if isinstance(fill_value, builtins.bool) else "int64" if isinstance(fill_value, int) else "float32"
    dtype = _dtype(dtype)
    shape = _shape([shape] if isinstance(shape, int) else list(shape))
    if isinstance(fill_value, (int, np.integer)) and dtype in _INT_RANGES and abs(int(fill_value)) > 2**53:
        # `full` takes its value as a float64, which rounds such an int: make it from exact
        # elements instead.
        value, (low, high) = int(fill_value), _INT_RANGES["int64"]
        if not low <= value < high:
            raise OverflowError(f"full: {value} is beyond the int64 range, which gt (as PyTorch) takes ints in")
        a, name = _array(np.full(shape, value, dtype=np.int64), dtype)
        return _gt._from_array(a, name, requires_grad)
    return _gt._full(shape, float(fill_value), dtype, requires_grad)


def zeros_like(t, dtype=None):
    """Zeros of `t`'s shape (and dtype)."""
    return zeros(*t.shape, dtype=dtype or t.dtype)


def ones_like(t, dtype=None):
    """Ones of `t`'s shape (and dtype)."""
    return ones(*t.shape, dtype=dtype or t.dtype)


def arange(start, end=None, step=1, dtype=None, requires_grad=False):
    """`start, start + step, ...` below `end` (int64 when every argument is an int)."""
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = "int64" if all(isinstance(v, int) for v in (start, end, step)) else "float32"
    return _gt._arange(float(start), float(end), float(step), _dtype(dtype), requires_grad)


def cat(tensors, axis=0, dim=None):
    """Joins tensors along an existing axis (gradients flow to each)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    if len(tensors) == 1:
        return tensors[0]
    return _gt._cat(tensors, axis if dim is None else dim)


def stack(tensors, axis=0, dim=None):
    """Joins tensors along a new axis."""
    axis = axis if dim is None else dim
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    return _gt._cat([t.unsqueeze(axis) for t in tensors], axis)


def where(condition, x, y):
    """`x` where `condition` (a bool tensor) holds, else `y`."""
    return _gt.where(condition, x, y)


class _Block:
    """A block of this thread's ops, as a context manager or a decorator: `_open()` gives the
    guard whose `close()` ends it, `_again()` a fresh block like this one for each call of a
    decorated function."""

    def __enter__(self):
        self._guard = self._open()
        return self

    def __exit__(self, *exc):
        self._guard.close()
        return False

    def __call__(self, fn):
        if inspect.isgeneratorfunction(fn):
            return self._wrap_generator(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self._again():
                return fn(*args, **kwargs)

        return wrapper

    def _wrap_generator(self, fn):
        """A generator function whose generator runs each resume inside a fresh block (as
        PyTorch's decorators do): the block is this thread's, and must not stay open while
        the caller runs between resumes."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            gen = fn(*args, **kwargs)
            try:
                with self._again():
                    response = gen.send(None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        with self._again():
                            gen.close()
                        raise
                    except BaseException as e:
                        with self._again():
                            response = gen.throw(e)
                    else:
                        with self._again():
                            response = gen.send(request)
            except StopIteration as e:
                return e.value

        return wrapper


class autocast(_Block):
    """Mixed precision, as PyTorch's `torch.autocast` (a context manager or a decorator): inside,
    matmuls and elementwise arithmetic run in `dtype` (`gt.bfloat16` or `gt.float16`) while
    parameters, their gradients and optimizer state stay float32; reductions and transcendental
    functions run in float32. `enabled=False` (or `dtype=gt.float32`) runs the block in float32,
    even inside an outer autocast or a signal whose config names a `dtype` (an explicit block wins
    over signals, as in the Rust API).

    `gt.autocast(gt.bfloat16)` and PyTorch's `gt.autocast("cuda", dtype=gt.float16)` both work:
    a device type ("cpu" or "cuda") only picks the default dtype as PyTorch does (bfloat16 for
    "cpu", float16 for "cuda"), since gt places work by worker, not by device."""

    _DEVICES = {"cpu": "bfloat16", "cuda": "float16"}

    def __init__(self, device_type=None, dtype=None, enabled=True, cache_enabled=None):
        if isinstance(device_type, str) and device_type in self._DEVICES:
            default = self._DEVICES[device_type]
        elif device_type is None:
            default = "bfloat16"
        elif dtype is None and _is_dtype(device_type):
            # The first argument is the dtype (`gt.autocast(gt.float16)`).
            default, dtype = None, device_type
        else:
            raise ValueError(f"autocast: device_type {device_type!r}: gt takes 'cpu' or 'cuda' (or a dtype first)")
        self._dtype = _dtype(dtype) if dtype is not None else default
        if self._dtype not in ("bfloat16", "float16", "float32"):
            from . import GtValueError

            raise GtValueError(f"autocast: takes bfloat16, float16 or float32 (off), not {self._dtype}")
        if not enabled:
            self._dtype = "float32"

    def _open(self):
        return _gt.Autocast(self._dtype)

    def _again(self):
        return autocast(dtype=self._dtype)


class no_grad(_Block):
    """Ops inside run without recording for autograd (a context manager or a decorator, with
    or without parentheses: `@gt.no_grad()` and `@gt.no_grad`, as PyTorch's)."""

    def __new__(cls, fn=None):
        if fn is None:
            return super().__new__(cls)
        return cls()(fn)

    def _open(self):
        return _gt.NoGrad()

    def _again(self):
        return no_grad()
