"""PyTorch's side of `cargo bench --bench vs_torch`: the bench starts this script once and
keeps it running, so that its rows and gt's can take turns (the same noise falls on both
sides of a ratio). It writes one JSON workload per line to stdin (`{"name", "kind", "n",
"op", "read", "reps", "warmup", "batch"}`) and this script answers each with one JSON line:
`{"name", "ms", "reps", "check"}`, where `ms` is the median time of one repetition (per op
when `batch` > 1) and `check` is a number that gt's side computes the same way from the
same inputs (a loss, or the mean |value| of a result), or `{"name", "error"}`. The first
line it prints is `{"name": "_info", "torch", "threads", "numpy"}`. Eager mode, CPU,
PyTorch's default thread count. Exits 3 when torch is missing.

The inputs are `pattern(n, seed, scale)`, a hash of the index that gt's side
computes bit for bit the same way, so that both sides run on the same numbers."""
import json
import statistics
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(3)


def pattern(n, seed, scale=1.0):
    """Values in [-scale, scale): murmur3's 32-bit finaliser of `i + seed * 0x9E3779B9`
    (mod 2^32) over 2^32, times 2, minus 1, times `scale`, in float64 rounded to float32
    (as `pattern` in vs_torch.rs)."""
    m = np.uint64(0xFFFFFFFF)
    h = (np.arange(n, dtype=np.uint64) + np.uint64(seed * 0x9E3779B9)) & m
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m
    h ^= h >> np.uint64(16)
    v = (h.astype(np.float64) / 4294967296.0 * 2.0 - 1.0) * scale
    return torch.from_numpy(v.astype(np.float32))


def mat(rows, cols, seed, scale=1.0):
    return pattern(rows * cols, seed, scale).reshape(rows, cols)


def mean_abs(t):
    return t.double().abs().mean().item()


def timed(fn, reps, warmup, batch=1):
    """Median of `reps` timings of `fn` after `warmup` untimed calls, per op of `batch`."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3 / batch)
    return statistics.median(times)


class Mlp:
    """The step of bench/mlp_torch.py on the shared pattern inputs."""

    def __init__(self):
        self.x = mat(64, 784, 1)
        self.y = mat(64, 10, 2)
        self.w1 = mat(784, 256, 3, 0.05).requires_grad_()
        self.w2 = mat(256, 10, 4, 0.05).requires_grad_()
        self.opt = torch.optim.SGD([self.w1, self.w2], lr=0.01)

    def step(self):
        h = (self.x @ self.w1).relu()
        loss = ((h @ self.w2 - self.y) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()


def mlp(w):
    # The check: the loss of the third step of a fresh model.
    check = Mlp()
    for _ in range(3):
        loss = check.step()
    m = Mlp()
    return timed(m.step, w["reps"], w["warmup"]), loss


def matmul(w):
    n = w["n"]
    a, b = mat(n, n, 5), mat(n, n, 6)
    ms = timed(lambda: a @ b, w["reps"], w["warmup"])
    return ms, mean_abs(a @ b)


def sgd(w):
    # What torch.optim.SGD's step does to one parameter (no momentum): in place, one pass.
    p, g = mat(784, 256, 16), mat(784, 256, 17)
    batch = w["batch"]

    def many():
        for _ in range(batch):
            p.add_(g, alpha=-0.01)

    ms = timed(many, w["reps"], w["warmup"], batch)
    once = mat(784, 256, 16)
    once.add_(g, alpha=-0.01)
    return ms, mean_abs(once)


def linear(w):
    x, wt, bias = mat(128, 512, 7), mat(512, 256, 8, 0.05), pattern(256, 9)
    ms = timed(lambda: (x @ wt + bias).numpy().copy(), w["reps"], w["warmup"])
    return ms, mean_abs(x @ wt + bias)


def mse(w):
    p, t = pattern(10_000, 10), pattern(10_000, 11)
    ms = timed(lambda: F.mse_loss(p, t).item(), w["reps"], w["warmup"])
    return ms, F.mse_loss(p, t).item()


def unary(w):
    op = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[w["op"]]
    x = pattern(10_000, 12, 4.0)
    if w["read"]:
        ms = timed(lambda: op(x).numpy().copy(), w["reps"], w["warmup"])
    else:
        ms = timed(lambda: op(x), w["reps"], w["warmup"])
    return ms, mean_abs(op(x))


def chain_fn(x, y):
    # relu(exp(tanh(x * 0.5 + 1) * y) - x) + y, one kernel per op (bench/fusion_torch.py).
    t = torch.tanh(x * 0.5 + 1.0)
    return torch.relu(torch.exp(t * y) - x) + y


def int_chain_fn(x, y):
    # maximum(relu((x * 3 + 1) * y - x) + y, x) * 2, as vs_torch.rs's `int_chain`.
    return torch.maximum(torch.relu((x * 3 + 1) * y - x) + y, x) * 2


def chain(w):
    n = w["n"]
    x, y = pattern(n, 13), pattern(n, 14)
    fn = chain_fn
    if w["op"] == "f64":
        x, y = x.double(), y.double()
    elif w["op"] == "i32":
        # gt multiplies the f32 pattern by 1000 in f32 and casts toward zero: the same here.
        x, y = (x * 1000).to(torch.int32), (y * 1000).to(torch.int32)
        fn = int_chain_fn
    ms = timed(lambda: fn(x, y), w["reps"], w["warmup"])
    return ms, mean_abs(fn(x, y))


def masked_softmax(w):
    # Softmax over the last axis where the [512, 512] mask holds, -1e30 elsewhere (vs_torch.rs).
    t = 512
    x = pattern(w["n"], 18, 4.0).reshape(w["n"] // (t * t), t, t)
    mask = pattern(t * t, 19).reshape(t, t) > 0

    def fn():
        return torch.softmax(torch.where(mask, x, -1e30), dim=-1)

    ms = timed(fn, w["reps"], w["warmup"])
    return ms, mean_abs(fn())


def randn(w):
    side = int(w["n"] ** 0.5)

    def fn():
        x = torch.randn(side, side)
        return torch.softmax(x, dim=-1) if w["op"] == "softmax" else x

    ms = timed(fn, w["reps"], w["warmup"])
    return ms, mean_abs(fn())


def read(w):
    t = pattern(w["n"], 15)
    ms = timed(lambda: t.numpy().copy(), w["reps"], w["warmup"])
    return ms, mean_abs(t)


def tiny(w):
    t = torch.ones(1)
    batch = w["batch"]
    if w["op"] == "item":

        def many():
            for _ in range(batch):
                torch.neg(t).item()

    else:
        # "issue" and "sync": an eager CPU op has run when it returns, there is nothing to
        # wait for, so both of gt's rows compare to the op alone.
        def many():
            for _ in range(batch):
                torch.neg(t)

    ms = timed(many, w["reps"], w["warmup"], batch)
    return ms, torch.neg(t).item()


RUN = {
    "mlp": mlp,
    "matmul": matmul,
    "sgd": sgd,
    "linear": linear,
    "mse": mse,
    "unary": unary,
    "chain": chain,
    "masked_softmax": masked_softmax,
    "randn": randn,
    "read": read,
    "tiny": tiny,
}

print(json.dumps({
    "name": "_info",
    "torch": torch.__version__,
    "threads": torch.get_num_threads(),
    "numpy": np.__version__,
}), flush=True)
for line in sys.stdin:
    if not line.strip():
        continue
    w = json.loads(line)
    try:
        ms, check = RUN[w["kind"]](w)
        answer = {"name": w["name"], "ms": ms, "reps": w["reps"], "check": check}
    except Exception as e:  # one row's failure is its answer; the others still run
        answer = {"name": w["name"], "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(answer), flush=True)
