"""PyTorch's side of `cargo bench --bench fusion`: the same 8-op chain (f32 and bf16) and row softmax on one
CPU thread, eager mode, printed as `name milliseconds` lines (medians). Exits 3 when torch
is missing, so the Rust bench can say so and go on."""
import statistics
import sys
import time

try:
    import torch
except ImportError:
    sys.exit(3)

torch.set_num_threads(1)
quick = len(sys.argv) > 1 and sys.argv[1] == "quick"
n = 1 << 16 if quick else 1 << 24
side = 256 if quick else 4096
reps = 3 if quick else 5


def timed(fn):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


x = torch.randn(n)
y = torch.randn(n)


def chain():
    # The bench's chain: relu(exp(tanh(x * 0.5 + 1) * y) - x) + y, one kernel per op.
    t = torch.tanh(x * 0.5 + 1.0)
    return torch.relu(torch.exp(t * y) - x) + y


s = torch.randn(side, side)
print(f"chain {timed(chain):.3f}")
x = x.to(torch.bfloat16)
y = y.to(torch.bfloat16)
print(f"chain_bf16 {timed(chain):.3f}")
print(f"softmax {timed(lambda: torch.softmax(s, dim=-1)):.3f}")
