"""PyTorch's side of `cargo bench --features cuda --bench cuda`: the same workloads on the
same GPU, printed as one JSON object (milliseconds, medians). Exits 3 when torch or CUDA is
missing, so the Rust bench can say so and go on."""
import json
import statistics
import sys

try:
    import torch
except ImportError:
    sys.exit(3)
if not torch.cuda.is_available():
    sys.exit(3)

quick = len(sys.argv) > 1 and sys.argv[1] == "quick"
reps = 3 if quick else 10


def timed(fn):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
n = (1 << 24) if quick else (1 << 28)
x = torch.rand(n, device="cuda")


def chain():
    y = x * 1.0001
    y = y + 0.5
    y = torch.tanh(y)
    y = torch.exp(y)
    y = y * 0.5
    y = y - 0.25
    y = torch.abs(y)
    return torch.sqrt(y)


out["chain_ms"] = timed(chain)
out["copy_ms"] = timed(lambda: x.clone())
x = x.bfloat16()
out["chain_bf16_ms"] = timed(chain)
del x
rows = 4096 if quick else 16384
s = torch.randn(rows, rows, device="cuda")
out["softmax_ms"] = timed(lambda: torch.softmax(s, dim=1))
del s
size = 1024 if quick else 4096
a = torch.randn(size, size, device="cuda")
b = torch.randn(size, size, device="cuda")
torch.backends.cuda.matmul.allow_tf32 = False
out["matmul_f32_ms"] = timed(lambda: a @ b)
torch.backends.cuda.matmul.allow_tf32 = True
out["matmul_tf32_ms"] = timed(lambda: a @ b)
torch.backends.cuda.matmul.allow_tf32 = False
for dtype, key in [(torch.bfloat16, "matmul_bf16_ms"), (torch.float16, "matmul_f16_ms")]:
    ah, bh = a.to(dtype), b.to(dtype)
    out[key] = timed(lambda: ah @ bh)
    del ah, bh
out["n"], out["rows"], out["size"] = n, rows, size
print(json.dumps(out))
