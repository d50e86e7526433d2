"""gt from Python, next to the Rust API and PyTorch eager, in one run on one machine.

Measures: an op issued from Python (a tiny add whose result is dropped), an op issued and
read back (`(a + 1).item()`), and one MLP training step (x 64x784 @ 784x256, relu, @ 256x10,
MSE, backward, SGD, `loss.item()`). The Rust API's figures come from the same loops run in
Rust on the same client (`gt._gt._bench_rust_*`), so the difference is what Python adds;
PyTorch's run in this process when torch is installed (skipped with a reason otherwise).

Run: `pip install ./python && python bench/python/bench.py` (GT_BENCH_QUICK=1: fewer
steps; GT_BENCH_SAVE=1: also writes bench/results/python-vm.txt).
"""

import os
import pathlib
import platform
import statistics
import sys
import time


import gt
from gt import _gt

QUICK = os.environ.get("GT_BENCH_QUICK") == "1"
N_OPS = 5_000 if QUICK else 50_000
N_TRIPS = 500 if QUICK else 3_000
STEPS, WARMUP = (30, 5) if QUICK else (300, 30)
REPEATS = 3 if QUICK else 5


def best(f):
    """The median of REPEATS runs of f() (seconds per unit)."""
    return statistics.median(f() for _ in range(REPEATS))


def issue(lib, sync=lambda: None):
    """Seconds per tiny add issued with `lib` (gt or torch), its result dropped."""
    a = lib.ones(64)
    start = time.perf_counter()
    for _ in range(N_OPS):
        a + 1
    issued = time.perf_counter() - start
    sync()
    return issued / N_OPS


def round_trip(lib):
    """Seconds per tiny add issued and read back."""
    a = lib.ones(1)
    start = time.perf_counter()
    for _ in range(N_TRIPS):
        (a + 1).item()
    return (time.perf_counter() - start) / N_TRIPS


def mlp(lib, sgd):
    """The median seconds of an MLP training step in `lib` with its SGD class."""
    lib.manual_seed(0)
    x, y = lib.randn(64, 784), lib.randn(64, 10)
    w1 = (lib.randn(784, 256) * 0.05).requires_grad_()
    w2 = (lib.randn(256, 10) * 0.05).requires_grad_()
    opt = sgd([w1, w2], lr=0.01)
    times = []
    for i in range(WARMUP + STEPS):
        start = time.perf_counter()
        loss = (((x @ w1).relu() @ w2 - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_figures():
    try:
        import torch
    except ImportError:
        return None, "torch is not installed (pip install torch)"
    figures = {"issue": best(lambda: issue(torch)), "trip": best(lambda: round_trip(torch)), "mlp": mlp(torch, torch.optim.SGD)}
    return figures, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


def side_by_side(python, rust):
    """Medians of REPEATS runs of each, taken in turn (so that both meet the same machine:
    this VM's round trips drift over a run)."""
    py_runs, rust_runs = [], []
    for _ in range(REPEATS):
        py_runs.append(python())
        rust_runs.append(rust())
    return statistics.median(py_runs), statistics.median(rust_runs)


def main():
    py, rust = {}, {}
    py["issue"], rust["issue"] = side_by_side(lambda: issue(gt, gt.synchronize), lambda: _gt._bench_rust_issue(N_OPS))
    py["trip"], rust["trip"] = side_by_side(lambda: round_trip(gt), lambda: _gt._bench_rust_round_trip(N_TRIPS))
    py["mlp"], rust["mlp"] = mlp(gt, gt.nn.SGD), statistics.median(_gt._bench_rust_mlp(STEPS, WARMUP))
    torch, torch_note = torch_figures()
    lines = [
        f"gt from Python beside the Rust API and PyTorch eager: {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, {_gt._runtime()}",
        f"medians of {REPEATS} runs ({N_OPS} issued ops, {N_TRIPS} round trips) and of {STEPS} MLP steps after {WARMUP}",
        f"PyTorch: {torch_note}",
        "",
        f"{'':<38}{'gt, Python':>12}{'gt, Rust API':>14}{'Python/Rust':>13}{'PyTorch':>11}{'gt Py/PyTorch':>15}",
    ]
    for key, name, unit, scale in [
        ("issue", "op issued (a + 1, result dropped)", "us", 1e6),
        ("trip", "op issued and read ((a + 1).item())", "us", 1e6),
        ("mlp", "MLP step 64x784->256->10, SGD", "ms", 1e3),
    ]:
        t = torch[key] * scale if torch else None
        lines.append(
            f"{name + ' (' + unit + ')':<38}{py[key] * scale:>12.2f}{rust[key] * scale:>14.2f}{py[key] / rust[key]:>12.2f}x"
            + (f"{t:>11.2f}{py[key] * scale / t:>14.2f}x" if t else f"{'-':>11}{'-':>15}")
        )
    lines.append("")
    lines.append("goals (issue 22): an op issued from Python <= 5 us; the MLP step from Python <= 1.3x the Rust API's")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if os.environ.get("GT_BENCH_SAVE") == "1":
        out = pathlib.Path(__file__).resolve().parents[1] / "results" / "python-vm.txt"
        out.write_text(text)
        print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
