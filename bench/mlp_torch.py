"""PyTorch's side of `cargo bench --bench mlp`: the same MLP step (x 64x784, w1 784x256, relu,
w2 256x10, MSE, backward, SGD, loss.item()) in eager mode on the CPU with PyTorch's default
threads; prints the median step time in milliseconds, then the same with the forward pass
under bf16 autocast. Exits 3 when torch is missing."""
import statistics
import sys
import time

try:
    import torch
except ImportError:
    sys.exit(3)

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
torch.manual_seed(0)
x = torch.randn(64, 784)
y = torch.randn(64, 10)
w1 = (torch.randn(784, 256) * 0.05).requires_grad_()
w2 = (torch.randn(256, 10) * 0.05).requires_grad_()
opt = torch.optim.SGD([w1, w2], lr=0.01)


def step(bf16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        h = (x @ w1).relu()
        loss = ((h @ w2 - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def median_ms(bf16):
    for _ in range(max(steps // 10, 5)):
        step(bf16)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(bf16)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


print(f"{median_ms(False):.4f} {median_ms(True):.4f}")
