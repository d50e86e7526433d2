"""Writes tests/gtir/run/masks.gtir: `bool` masks read by kernels of every type (attention's
masked softmax, a mask broadcast over heads, an f64 `where` on an f32 comparison, an i64 one),
with expectations computed by PyTorch. Run from the repository root:
python3 tests/gtir/gen/masks.py"""
import torch

NAME = {torch.float64: "f64", torch.float32: "f32", torch.int64: "i64", torch.int32: "i32", torch.bool: "bool"}
lines = ["; test run",
         "; `bool` masks read by fused kernels of every type, as 0 and 1: attention's masked softmax,",
         "; a causal mask broadcast over heads, f64 and integer `where`s on masks. Expectations from",
         "; PyTorch, written by tests/gtir/gen/masks.py.", ""]


def fmt(x, dtype):
    if dtype == torch.bool:
        return "true" if x else "false"
    if not dtype.is_floating_point:
        return str(int(x))
    return repr(float(x))


def ty(t):
    return f"{NAME[t.dtype]}[{', '.join(map(str, t.shape))}]"


def values(t):
    return "[" + ", ".join(fmt(x, t.dtype) for x in t.flatten().tolist()) + "]"


def tensor(name, t):
    lines.append(f"%{name} = tensor {ty(t)} {values(t)}")
    return t


def op(name, text, t, approx=False):
    lines.append(f"%{name} = {text}")
    lines.append(f"expect %{name} {'~=' if approx else '=='} {ty(t)} {values(t)}")
    return t


def comment(text):
    lines.extend(["", f"; {text}"])


comment("masked softmax over rows (one kernel: the mask is read as 0 and 1)")
m = tensor("m", torch.tensor([[True, False, True, True], [True, True, False, False], [False, True, True, True]]))
s = tensor("s", torch.tensor([[0.5, 2.0, -1.0, 3.0], [1.0, -2.0, 4.0, 0.25], [2.5, 0.0, -0.5, 1.5]], dtype=torch.float32))
lines.append("%w = where %m, %s, -1e+30")
w = torch.where(m, s, torch.tensor(-1e30, dtype=torch.float32))
lines.append("%mx = max %w axes=[1] keepdim")
mx = w.amax(dim=1, keepdim=True)
lines.append("%sh = sub %w, %mx")
sh = w - mx
lines.append("%ex = exp %sh")
ex = torch.exp(sh)
lines.append("%sm = sum %ex axes=[1] keepdim")
sm = ex.sum(dim=1, keepdim=True)
op("p", "div %ex, %sm", ex / sm, approx=True)

comment("a causal mask [T, T] broadcast over 2 heads: scores [2, T, T], masked and scaled")
causal = tensor("causal", torch.tril(torch.ones(3, 3, dtype=torch.bool)))
sc = tensor("sc", torch.arange(18, dtype=torch.float32).reshape(2, 3, 3) * 0.25 - 1.0)
lines.append("%cm = unsqueeze %causal axis=0")
lines.append("%cb = broadcast_to %cm shape=[2, 3, 3]")
lines.append("%scaled = mul %sc, 0.5")
op("att", "where %cb, %scaled, 0.0", torch.where(causal, sc * 0.5, torch.tensor(0.0)))

comment("an f64 where on an f32 comparison's mask: the mask is computed in f32, read by the f64 kernel")
a = tensor("a", torch.tensor([0.1, 0.2, 0.30000001192092896, 0.4], dtype=torch.float32))
d = tensor("d", torch.tensor([1e300, -2.5, 3.0, 1e-300], dtype=torch.float64))
lines.append("%a3 = mul %a, 3.0")
lines.append("%big = gt %a3, 0.9")
d2 = d * 2.0
lines.append("%d2 = mul %d, 2.0")
op("dw", "where %big, %d2, %d", torch.where(a * 3.0 > 0.9, d2, d))

comment("integer where on masks: i64 and i32 values, a mask from the user and one negated")
k = tensor("k", torch.tensor([True, False, True, False]))
i = tensor("i", torch.tensor([9223372036854775807, -5, 7, -9223372036854775808], dtype=torch.int64))
j = tensor("j", torch.tensor([2147483647, -3, 11, 0], dtype=torch.int32))
lines.append("%i1 = add %i, 1")
op("iw", "where %k, %i1, %i", torch.where(k, i + 1, i))
lines.append("%nk = eq %k, 0")
lines.append("%j2 = mul %j, 2")
op("jw", "where %nk, %j2, %j", torch.where(~k, j * 2, j))

open("tests/gtir/run/masks.gtir", "w").write("\n".join(lines) + "\n")
