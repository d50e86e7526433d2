"""Signals (the Python GT's `gt.signal`): named scopes of the instruction stream. Ops issued in
`with gt.signal.context("layer1"):` belong to signal "layer1", whose config (`GT_CONFIG`,
`gt.load_config`) may place them over workers, compile them or run them in bfloat16; a
scope's backward signal scopes the gradient ops of what it computed (pipeline stages)."""

import contextlib
import threading

from . import _gt

_local = threading.local()


def _stack():
    s = getattr(_local, "scopes", None)
    if s is None:
        s = _local.scopes = []
    return s


@contextlib.contextmanager
def context(name, backward=None):
    """A scope of signal `name` until the block ends (gradients of what it computes run in
    signal `backward`, else in its config's `backward`)."""
    scope = _gt.SignalScope(name, backward)
    try:
        yield
    finally:
        scope.close()


signal = context


def enter(name, backward=None):
    """Opens a scope of signal `name`; close it with `exit(name)` (innermost first)."""
    _stack().append(_gt.SignalScope(name, backward))


def exit(name):  # noqa: A001 (the Python GT's name)
    """Closes the innermost scope, which must be signal `name`."""
    s = _stack()
    if not s:
        raise RuntimeError(f"signal.exit({name!r}): no signal is open")
    if s[-1].name != name:
        raise RuntimeError(f"signal.exit({name!r}): the innermost open signal is {s[-1].name!r}")
    s.pop().close()


def tensor(t, name, backward_name=None):
    """A copy of `t` made inside signal `name`, so that its config places it (copy-shard)."""
    if backward_name is None:
        return _gt._signal_tensor(t, name)
    with context(name, backward_name):
        return t.clone()


def current_signal():
    """The innermost open signal's name, or None."""
    c = _gt._signal_current()
    return c[0] if c else None


def current_backward_signal():
    """The innermost open signal's backward signal, or None."""
    c = _gt._signal_current()
    return c[1] if c else None


def get_signal_stack():
    """The open signals of this thread, outermost first."""
    return _gt._signal_stack()
