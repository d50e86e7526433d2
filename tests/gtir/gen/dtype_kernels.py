"""Writes tests/gtir/run/dtype_kernels.gtir: every op family in f64, i64, i32 and bool, and
every cast, with expectations computed by PyTorch (the same op on torch tensors of the same
dtype). Run from the repository root: python3 tests/gtir/gen/dtype_kernels.py"""
import math
import torch

TORCH = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
         "i64": torch.int64, "i32": torch.int32, "bool": torch.bool}
NAME = {v: k for k, v in TORCH.items()}
lines = ["; test run",
         "; Every op family in f64, i64, i32 and bool, and every cast: what each kernel computes in",
         "; (f64, i64) and how it loads and stores each dtype. Expectations from PyTorch, written by",
         "; tests/gtir/gen/dtype_kernels.py.", ""]
env = {}


def fmt(x, dtype):
    if dtype == torch.bool:
        return "true" if x else "false"
    if not dtype.is_floating_point:
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def ty(t):
    return f"{NAME[t.dtype]}[{', '.join(map(str, t.shape))}]"


def values(t):
    return "[" + ", ".join(fmt(x, t.dtype) for x in t.flatten().tolist()) + "]"


def tensor(name, data, dtype):
    t = torch.tensor(data, dtype=TORCH[dtype])
    env[name] = t
    lines.append(f"%{name} = tensor {ty(t)} {values(t)}")


def op(name, text, t, approx=False):
    env[name] = t
    lines.append(f"%{name} = {text}")
    lines.append(f"expect %{name} {'~=' if approx else '=='} {ty(t)} {values(t)}")


def comment(text):
    lines.extend(["", f"; {text}"])


E = env
comment("f64: arithmetic rounds in f64, comparisons give bool, sqrt and division are IEEE's")
tensor("a", [[1.5, -2.25, 1e300], [0.1, -0.0, 3.0]], "f64")
tensor("b", [[0.2, 4.0, 1e300], [0.3, 5e-324, -3.0]], "f64")
tensor("v", [10.0, -1e-300, 0.5], "f64")
for o, f in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
             ("maximum", torch.maximum), ("minimum", torch.minimum)]:
    op(f"d_{o}", f"{o} %a, %b", f(E["a"], E["b"]))
for o, f in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)]:
    op(f"d_{o}", f"{o} %a, %b", f(E["a"], E["b"]))
op("d_bias", "add %a, %v", E["a"] + E["v"])
op("d_scaled", "mul %a, 0.1", E["a"] * 0.1)
op("d_neg", "neg %a", -E["a"])
op("d_abs", "abs %a", E["a"].abs())
op("d_relu", "relu %a", torch.relu(E["a"]))
op("d_sqrt", "sqrt %d_abs", E["d_abs"].sqrt())
op("d_rsqrt", "rsqrt %v_pos", None) if False else None
tensor("pos", [4.0, 2.0, 1e-300], "f64")
op("d_rsqrt", "rsqrt %pos", torch.rsqrt(E["pos"]))
op("d_exp", "exp %v", torch.exp(E["v"]), approx=True)
op("d_erf", "erf %a", torch.erf(E["a"]), approx=True)
op("d_tanh", "tanh %a", torch.tanh(E["a"]), approx=True)
op("d_log", "log %pos", torch.log(E["pos"]), approx=True)
op("d_sum0", "sum %a axes=[0]", E["a"].sum(0))
op("d_sum1", "sum %a axes=[1] keepdim", E["a"].sum(1, keepdim=True))
op("d_mean", "mean %b", E["b"].mean())
op("d_max", "max %a axes=[1]", E["a"].amax(1))
op("d_min", "min %b", E["b"].amin())
op("d_where", "where %d_lt, %a, %b", torch.where(E["d_lt"], E["a"], E["b"]))

comment("i64: wrapping arithmetic past 2^63, exact past 2^53, i64 sums")
tensor("i", [[9007199254740993, -5, 4611686018427387904], [7, 0, -9223372036854775807]], "i64")
tensor("j", [[3, -5, 2], [-7, 1, -2]], "i64")
for o, f in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("maximum", torch.maximum),
             ("minimum", torch.minimum), ("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("ge", torch.ge)]:
    op(f"l_{o}", f"{o} %i, %j", f(E["i"], E["j"]))
op("l_plus", "add %i, 3", E["i"] + 3)
op("l_neg", "neg %i", -E["i"])
op("l_abs", "abs %j", E["j"].abs())
op("l_relu", "relu %j", torch.relu(E["j"]))
op("l_div", "div %i, %j", torch.div(E["i"], E["j"]).float())
op("l_sum", "sum %i axes=[0]", E["i"].sum(0))
op("l_max", "max %i axes=[1]", E["i"].amax(1))
op("l_min", "min %j", E["j"].amin())
op("l_where", "where %l_lt, %i, %j", torch.where(E["l_lt"], E["i"], E["j"]))

comment("i32: computed in i64, wrapping as it is stored; sums are i64")
tensor("p", [[2147483647, -2147483648, 46341], [-1, 0, 65536]], "i32")
tensor("q", [[1, -1, 46341], [-1, 5, 65536]], "i32")
for o, f in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("maximum", torch.maximum), ("le", torch.le)]:
    op(f"w_{o}", f"{o} %p, %q", f(E["p"], E["q"]))
op("w_neg", "neg %p", -E["p"])
op("w_abs", "abs %p", E["p"].abs())
op("w_sum", "sum %p", E["p"].sum())
op("w_sum1", "sum %p axes=[1]", E["p"].sum(1))
op("w_max", "max %p axes=[0]", E["p"].amax(0))
op("w_wide", "add %p, %i", E["p"] + E["i"])

comment("bool: 0 and 1 in i64 kernels, nonzero is true as stored")
tensor("c", [[True, False, True], [False, False, True]], "bool")
tensor("e", [[True, True, False], [False, True, True]], "bool")
op("c_eq", "eq %c, %e", E["c"] == E["e"])
op("c_lt", "lt %c, %e", E["c"] < E["e"])
op("c_sum", "sum %c axes=[1]", E["c"].sum(1))
op("c_max", "max %c axes=[0]", E["c"].amax(0))
op("c_min", "min %c", E["c"].amin())
op("c_plus", "add %c, %e", None) if False else None
op("c_where", "where %c, %c, %e", torch.where(E["c"], E["c"], E["e"]))
op("c_pick", "where %c, %i, %b", torch.where(E["c"], E["i"].double(), E["b"]))

comment("an integer meeting an op on halves is rounded to the half first")
tensor("mi", [2049, 70000, -3, 4097], "i64")
tensor("mh", [2048.0, -60000.0, 0.5, 4096.0], "f16")
tensor("mb", [1.0, 2.0, 3.0, 4.0], "bf16")
tensor("mc", [True, False, True, False], "bool")
op("mix_add", "add %mi, %mh", E["mi"] + E["mh"])
op("mix_eq", "eq %mi, %mh", E["mi"] == E["mh"])
op("mix_where", "where %mc, %mi, %mb", torch.where(E["mc"], E["mi"], E["mb"]))

comment("long rows reduce in two passes, partials in what the kernel computes in")
op("long", "arange i64 end=70000", torch.arange(70000, dtype=torch.int64)[:0] if False else None) if False else None
lines.append("%long = arange i64 end=70000")
env["long"] = torch.arange(70000, dtype=torch.int64)
op("long_sq", "mul %long, %long", E["long"] * E["long"] * 0 + E["long"] * E["long"]) if False else None
lines.append("%long_sq = mul %long, %long")
env["long_sq"] = E["long"] * E["long"]
op("long_sum", "sum %long_sq", E["long_sq"].sum())
op("long_max", "max %long_sq", E["long_sq"].amax())
lines.append("%longd = cast %long f64")
env["longd"] = E["long"].double()
op("longd_mean", "mean %longd", E["longd"].mean())
lines.append("%longw = cast %long i32")
env["longw"] = E["long"].int()
op("longw_sum", "sum %longw", E["longw"].sum())
lines.append("%odd = gt %long, 34999")
env["odd"] = E["long"] > 34999
op("odd_sum", "sum %odd", E["odd"].sum())

comment("data moves keep the dtype")
op("i_t", "transpose %i", E["i"].t())
op("a_t", "transpose %a", E["a"].t())
op("c_t", "transpose %c", E["c"].t())
op("p_rev", "slice %p [:, ::-1]", E["p"].flip(1))
op("i_row", "slice %i [1]", E["i"][1])
op("a_flat", "reshape %a shape=[3, 2]", E["a"].reshape(3, 2))
op("c_cat", "concat %c, %e axis=1", torch.cat([E["c"], E["e"]], 1))
op("i_cat", "concat %i, %j axis=0", torch.cat([E["i"], E["j"]], 0))
op("v_wide", "broadcast_to %v shape=[2, 3]", E["v"].expand(2, 3))
lines.append("%i0, %i1 = split %i size=2 axis=1")
env["i0"], env["i1"] = torch.split(E["i"], 2, 1)
lines.append(f"expect %i1 == {ty(E['i1'])} {values(E['i1'])}")
tensor("cube", [[[1, 2], [3, 4]], [[5, 6], [7, 8]]], "i32")
op("cube_p", "permute %cube perm=[2, 0, 1]", E["cube"].permute(2, 0, 1))

comment("creation in every dtype")
for d in ["f64", "i64", "i32", "bool"]:
    op(f"full_{d}", f"full {d}[2, 2] {'1' if d == 'bool' else '-3' if d != 'f64' else '0.1'}",
       torch.full((2, 2), True if d == "bool" else (-3 if d != "f64" else 0.1), dtype=TORCH[d]))
    op(f"ones_{d}", f"ones {d}[3]", torch.ones(3, dtype=TORCH[d]))
op("ar_d", "arange f64 start=0.5 end=2 step=0.25", torch.arange(0.5, 2, 0.25, dtype=torch.float64))
op("ar_w", "arange i32 start=-3 end=9 step=4", torch.arange(-3, 9, 4, dtype=torch.int32))
op("ar_h", "arange f16 start=2040 end=2060 step=3", torch.arange(2040, 2060, 3, dtype=torch.float64).half())

comment("casts between every pair: floats truncate into integers, integers wrap, nonzero is true")
tensor("sf", [-1.75, 2.5, 0.0, 1e9, -3e9, 65520.0, 3.0e-8], "f64")
tensor("sl", [9007199254740993, -5, 1099511627776, 7, 0, -2147483649, 255], "i64")
tensor("sb", [True, False, True, True, False, False, True], "bool")
for src in ["sf", "sl", "sb"]:
    for d in ["f64", "f32", "f16", "bf16", "i64", "i32", "bool"]:
        if NAME[E[src].dtype] == d:
            continue
        t = E[src]
        # Out of range float to int32 is not defined in PyTorch: through int64, as gt does.
        got = t.to(torch.int64).to(torch.int32) if (d == "i32" and t.dtype.is_floating_point) else t.to(TORCH[d])
        op(f"{src}_{d}", f"cast %{src} {d}", got)
for src, d in [("sf", "f32"), ("sl", "f16")]:
    lines.append(f"%{src}_{d}_back = cast %{src}_{d} f64")
    env[f"{src}_{d}_back"] = E[f"{src}_{d}"].double()
    lines.append(f"expect %{src}_{d}_back == {ty(E[src + '_' + d + '_back'])} {values(E[src + '_' + d + '_back'])}")
open("tests/gtir/run/dtype_kernels.gtir", "w").write("\n".join(lines) + "\n")
print(len(lines), "lines")
