"""gt: a multiplexing tensor runtime built like a compiler, with the Python GT's API.

`import gt` and make tensors: the first op starts an embedded dispatcher and workers in this
process (or connects to the `gt server` that `gt.connect` or `GT_CONNECT` names). Every op is
typed on the spot and queued; reads (`.numpy()`, `.item()`, `repr`) wait. Each Python thread
gets its own connection.
"""

import atexit as _atexit

from . import _gt
from ._gt import Tensor, connect, gpu_workers, is_grad_enabled, manual_seed, synchronize
from ._api import (
    _as_tensor,
    arange,
    autocast,
    cat,
    from_numpy,
    full,
    no_grad,
    ones,
    ones_like,
    rand,
    randn,
    stack,
    tensor,
    where,
    zeros,
    zeros_like,
)

__version__ = "0.1.0"


class GtError(RuntimeError):
    """A failure reported by gt's runtime (a dispatcher or worker), with gt's message."""


class GtValueError(GtError, ValueError):
    """A bad argument found before anything ran: shapes, axes, dtypes, configs."""


class GtIndexError(GtValueError, IndexError):
    """An index out of range (an `IndexError`, as in NumPy and PyTorch)."""


_gt._register_errors(GtError, GtValueError, GtIndexError)
_gt._register_as_tensor(_as_tensor)

from . import config, debug, nn, signal  # noqa: E402
from .config import (  # noqa: E402
    Config,
    ShardConfig,
    SignalConfig,
    get_config,
    get_signal_config,
    load_config,
    register_config,
)

signals = signal


def _shutdown():
    _gt._shutdown()


_atexit.register(_shutdown)

# Dtype names, as the Python GT's (plain strings, so `t.dtype == gt.float32`). Set last: they
# shadow builtins (`bool`, `float`, `int`) in this module.
float64 = "float64"
float32 = "float32"
float16 = "float16"
bfloat16 = "bfloat16"
int64 = "int64"
int32 = "int32"
bool = "bool"  # noqa: A001
half = float16
double = float64
long = int64
