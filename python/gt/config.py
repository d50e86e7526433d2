"""Signal configs (the Python GT's `gt.config`): what each named signal's scope does (its
placement over workers, its backward signal, compilation, mixed precision). One config per
process, from `GT_CONFIG`, `gt.load_config(path)` or `gt.register_config`."""

import os

from . import _gt


class ShardConfig:
    """How a signal's tensors are placed: split along `axis` over `workers` (all when None),
    or copied to each of them when `replicated`."""

    def __init__(self, axis=0, workers=None, replicated=False):
        self.axis = axis
        self.workers = list(workers) if workers is not None else None
        self.replicated = replicated

    def __repr__(self):
        return f"ShardConfig(axis={self.axis}, workers={self.workers}, replicated={self.replicated})"

    def __eq__(self, other):
        return isinstance(other, ShardConfig) and vars(self) == vars(other)


class SignalConfig:
    """One signal's config: `shard`, `backward_signal` (the signal its gradients run in),
    `compile` (compile the scope), `dtype` (mixed precision, e.g. "bfloat16")."""

    def __init__(self, shard=None, backward_signal=None, compile=False, dtype=None):
        self.shard = shard
        self.backward_signal = backward_signal
        self.compile = compile
        self.dtype = dtype

    def __repr__(self):
        return (
            f"SignalConfig(shard={self.shard!r}, backward_signal={self.backward_signal!r}, "
            f"compile={self.compile}, dtype={self.dtype!r})"
        )

    def __eq__(self, other):
        return isinstance(other, SignalConfig) and vars(self) == vars(other)


def _from_tuple(t):
    shard, backward, compile_, dtype = t
    s = ShardConfig(shard[0], shard[1], shard[2]) if shard is not None else None
    return SignalConfig(s, backward, compile_, dtype)


class Config:
    """The process's signal configs, by signal name."""

    @property
    def signals(self):
        return {name: _from_tuple(t) for name, t in _gt._config_signals()}

    def load(self, path):
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"config file not found: {path}")
        _gt._load_config(path)
        return self

    def load_from_env(self, env_var="GT_CONFIG"):
        path = os.environ.get(env_var)
        if path:
            self.load(path)
        return self

    def get_signal(self, name):
        return self.signals.get(name)

    def has_signal(self, name):
        return name in self.signals

    def register_signal(self, name, config):
        if not isinstance(config, SignalConfig):
            raise TypeError(f"register_signal: expected a SignalConfig, got {type(config).__name__}")
        shard = config.shard
        shard_t = None
        if shard is not None:
            workers = [int(w) for w in shard.workers] if shard.workers is not None else None
            shard_t = (int(shard.axis), workers, bool(shard.replicated))
        dtype = None
        if config.dtype is not None:
            from ._api import _dtype

            dtype = _dtype(config.dtype)
        _gt._register_config(name, shard_t, config.backward_signal, bool(config.compile), dtype)

    def clear(self):
        _gt._clear_config()

    def __repr__(self):
        return f"Config({self.signals!r})"


_config = Config()


def load_config(path):
    """Loads a YAML config (the GT README's format) as the process's."""
    return _config.load(path)


def get_config():
    """The process's config."""
    return _config


def get_signal_config(name):
    """One signal's config, or None."""
    return _config.get_signal(name)


def register_config(name, config):
    """Adds or replaces one signal's config."""
    _config.register_signal(name, config)
