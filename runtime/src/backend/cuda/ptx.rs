//! PTX code generation: one kernel of the kernel IR ([`gt_ir::kernel`]) to the text of a PTX
//! module with one entry, `gt_kernel`, plus the launch shape. No CUDA is needed to generate
//! (CI assembles every generated module with `ptxas`); the driver JIT-compiles the text
//! when a CUDA worker loads it.
//!
//! - Maps: a grid-stride loop; 128-bit loads and stores (`v4`) when every buffer is read
//!   contiguously or uniformly and the length divides by 4; otherwise each element's
//!   coordinates are decoded from its linear index and dotted with each buffer's strides.
//! - Reductions: one block per output element; each thread folds a strided share of the
//!   reduced elements, then warp shuffles and shared memory combine the block's partials.
//! - Matmul: shared-memory tiling (`BM x BN` tile per block, `TM x TN` per thread, `BK` deep),
//!   FMA on f32; the tile choice is printed in the module's header comment.
//!
//! Index arithmetic is 32-bit signed, so every buffer and iteration space must have fewer
//! than 2^31 elements ([`PtxError::TooLarge`]).
//!
//! Numerics against the interpreter: add/sub/mul/div/sqrt round like IEEE (`.rn`), so they
//! agree exactly; `exp`, `log`, `tanh`, `sigmoid`, `pow` and `randn` use the hardware's
//! approximate `ex2`/`lg2`/`cos` (relative error about 2^-22), so they agree to ~1e-6.

use gt_ir::formula::{Algebra, Term, Var};
use gt_ir::kernel::{Access, Kernel, MapKernel, MatMulKernel, Node, Precision};
use gt_ir::{BinaryOp, BinaryPrim, OpDef, ReduceOp, UnaryOp, UnaryPrim};
use std::fmt::Write;
use thiserror::Error;

/// The entry point's name in every generated module.
pub const ENTRY: &str = "gt_kernel";

/// The PTX ISA version and target written into modules (sm_80 code runs on sm_80 and newer:
/// Ampere, Hopper).
pub const PTX_VERSION: &str = "7.0";
/// See [`PTX_VERSION`].
pub const PTX_TARGET: &str = "sm_80";

/// CUDA's limit on grid dimensions y and z.
pub const MAX_GRID_YZ: u32 = 65_535;

/// Largest element count (of a buffer or an iteration space) the 32-bit indexing handles.
pub const MAX_ELEMENTS: usize = i32::MAX as usize;

/// Why a kernel cannot be generated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PtxError {
    /// More blocks along grid y or z than CUDA allows (65535).
    #[error("matmul grid too large for CUDA ({what}; at most {MAX_GRID_YZ} each)")]
    Grid {
        /// What overflowed.
        what: String,
    },
    /// A kernel that breaks the kernel IR's rules (a bug in whoever built it).
    #[error("malformed kernel: {0}")]
    Malformed(String),
    /// Too many elements for 32-bit indexing.
    #[error("{elements} elements is too large for the CUDA backend's 32-bit indexing (at most {MAX_ELEMENTS})")]
    TooLarge {
        /// The element count.
        elements: usize,
    },
}

/// A generated module and how to launch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxKernel {
    /// The PTX module text.
    pub text: String,
    /// Blocks `(x, y, z)`.
    pub grid: (u32, u32, u32),
    /// Threads per block `(x, y, z)`.
    pub block: (u32, u32, u32),
}

/// Generates the PTX of `kernel`. Its parameters are the output buffer's address, then one
/// address per input (`u64` each).
pub fn generate(kernel: &Kernel) -> Result<PtxKernel, PtxError> {
    gt_ir::kernel::validate(kernel).map_err(PtxError::Malformed)?;
    match kernel {
        Kernel::Map(k) if k.is_row_kernel() => rows(k),
        Kernel::Map(k) => map(k),
        Kernel::MatMul(k) => matmul(k),
    }
}

fn check(elements: usize) -> Result<(), PtxError> {
    if elements > MAX_ELEMENTS {
        return Err(PtxError::TooLarge { elements });
    }
    Ok(())
}

/// ln 2 in two parts (fdlibm): `e * LN2_HI` is exact for the exponents of f64.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
/// See [`LN2_HI`].
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// `pi/2 - FRAC_PI_2` (Cody-Waite reduction).
const PI_2_LO: f64 = 6.123_233_995_736_766e-17;

/// An f32 immediate in PTX's exact hex form.
fn f32_imm(x: f32) -> String {
    format!("0f{:08X}", x.to_bits())
}

fn f64_imm(x: f64) -> String {
    format!("0d{:016X}", x.to_bits())
}

/// Builds a kernel body with fresh virtual registers; declarations are written at the end.
#[derive(Default)]
struct Emitter {
    body: String,
    regs: [usize; 5],
    labels: usize,
}

#[derive(Clone, Copy)]
enum Reg {
    B32 = 0,
    B64 = 1,
    F32 = 2,
    F64 = 3,
    Pred = 4,
}

const REG_PREFIX: [(&str, &str); 5] =
    [("%r", ".b32"), ("%rd", ".b64"), ("%f", ".f32"), ("%fd", ".f64"), ("%p", ".pred")];

impl Emitter {
    fn reg(&mut self, kind: Reg) -> String {
        let n = &mut self.regs[kind as usize];
        *n += 1;
        format!("{}{}", REG_PREFIX[kind as usize].0, *n)
    }

    fn label(&mut self, what: &str) -> String {
        self.labels += 1;
        format!("$L_{what}_{}", self.labels)
    }

    fn op(&mut self, line: impl AsRef<str>) {
        self.body.push('\t');
        self.body.push_str(line.as_ref());
        self.body.push_str(";\n");
    }

    fn place(&mut self, label: &str) {
        let _ = writeln!(self.body, "{label}:");
    }

    /// `dst = op(args)` into a fresh register of `kind`.
    fn value(&mut self, kind: Reg, instr: &str, args: &str) -> String {
        let d = self.reg(kind);
        self.op(format!("{instr} {d}, {args}"));
        d
    }

    fn param_pointer(&mut self, name: &str) -> String {
        let raw = self.value(Reg::B64, "ld.param.u64", &format!("[{name}]"));
        self.value(Reg::B64, "cvta.to.global.u64", &raw)
    }

    /// `while var < bound { body; var += step }` over an initialised s32 register `var`, with
    /// labels named `top`/`end`. The bound test is unsigned, so a grid-stride index that passes
    /// 2^31 ends the loop instead of wrapping negative.
    fn counted_loop(
        &mut self,
        (top, end): (&str, &str),
        var: &str,
        bound: usize,
        step: &str,
        body: impl FnOnce(&mut Emitter),
    ) {
        let (top, end) = (self.label(top), self.label(end));
        self.place(&top);
        let past = self.predicate("ge.u32", var, &bound.to_string());
        self.op(format!("@{past} bra {end}"));
        body(self);
        self.op(format!("add.s32 {var}, {var}, {step}"));
        self.op(format!("bra.uni {top}"));
        self.place(&end);
    }

    /// The output's and `inputs` inputs' global addresses, from the kernel's parameters.
    fn buffers(&mut self, inputs: usize) -> (String, Vec<String>) {
        let out = self.param_pointer("gt_param_0");
        (out, (0..inputs).map(|i| self.param_pointer(&format!("gt_param_{}", i + 1))).collect())
    }

    fn special(&mut self, name: &str) -> String {
        self.value(Reg::B32, "mov.u32", name)
    }

    /// The module: header, optional module-scope declarations, the entry with its
    /// parameters and register declarations.
    fn finish(self, comment: &str, globals: &str, params: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "// gt generated kernel: {comment}");
        let _ = writeln!(out, ".version {PTX_VERSION}\n.target {PTX_TARGET}\n.address_size 64\n");
        out.push_str(globals);
        let names: Vec<String> = (0..params).map(|i| format!("\t.param .u64 gt_param_{i}")).collect();
        let _ = writeln!(out, ".visible .entry {ENTRY}(\n{}\n)\n{{", names.join(",\n"));
        for (i, (prefix, ty)) in REG_PREFIX.iter().enumerate() {
            if self.regs[i] > 0 {
                let _ = writeln!(out, "\t.reg {ty} {prefix}<{}>;", self.regs[i] + 1);
            }
        }
        out.push_str(&self.body);
        out.push_str("\tret;\n}\n");
        out
    }

    /// `base + index * 4`, the address of element `index` (s32) of an f32 buffer.
    fn element_address(&mut self, base: &str, index: &str) -> String {
        self.value(Reg::B64, "mad.wide.s32", &format!("{index}, 4, {base}"))
    }

    /// Decodes `index` (s32) into coordinates over `dims` (row-major); `None` for axes of
    /// size 1 (coordinate 0).
    fn coords(&mut self, index: &str, dims: &[usize]) -> Vec<Option<String>> {
        let mut out = vec![None; dims.len()];
        let mut rest = index.to_string();
        let last_big = dims.iter().position(|&d| d > 1);
        for (axis, &d) in dims.iter().enumerate().rev() {
            if d <= 1 {
                continue;
            }
            if Some(axis) == last_big {
                out[axis] = Some(rest.clone());
                break;
            }
            out[axis] = Some(self.value(Reg::B32, "rem.u32", &format!("{rest}, {d}")));
            rest = self.value(Reg::B32, "div.u32", &format!("{rest}, {d}"));
        }
        out
    }

    /// `offset + sum(coord * stride)` as an s32 register (or immediate).
    fn dot(&mut self, offset: i64, coords: &[Option<String>], strides: &[i64]) -> String {
        let mut acc: Option<String> = None;
        for (c, &s) in coords.iter().zip(strides) {
            let (Some(c), true) = (c, s != 0) else { continue };
            acc = Some(match acc {
                None => self.value(Reg::B32, "mul.lo.s32", &format!("{c}, {s}")),
                Some(a) => self.value(Reg::B32, "mad.lo.s32", &format!("{c}, {s}, {a}")),
            });
        }
        match acc {
            None => self.value(Reg::B32, "mov.s32", &offset.to_string()),
            Some(a) if offset == 0 => a,
            Some(a) => self.value(Reg::B32, "add.s32", &format!("{a}, {offset}")),
        }
    }

    fn select(&mut self, pred: &str, on_true: &str, on_false: &str) -> String {
        self.value(Reg::F32, "selp.f32", &format!("{on_true}, {on_false}, {pred}"))
    }

    fn predicate(&mut self, cmp: &str, a: &str, b: &str) -> String {
        self.value(Reg::Pred, &format!("setp.{cmp}"), &format!("{a}, {b}"))
    }

    /// `e^x` as `2^(x log2 e)`.
    fn exp(&mut self, x: &str) -> String {
        let t = self.value(Reg::F32, "mul.rn.f32", &format!("{x}, {}", f32_imm(std::f32::consts::LOG2_E)));
        self.value(Reg::F32, "ex2.approx.f32", &t)
    }

    /// Evaluates node `target` and what it needs, memoised in `memo` (one slot per node,
    /// reused when filled; row reductions are filled in before). `leaf` gives inputs, the
    /// matmul product and the element's linear index (for iota and random nodes).
    fn eval(
        &mut self,
        nodes: &[Node],
        target: usize,
        memo: &mut [Option<String>],
        leaf: &mut dyn FnMut(&mut Emitter, Leaf) -> String,
    ) -> String {
        if let Some(r) = &memo[target] {
            return r.clone();
        }
        for o in nodes[target].operands() {
            self.eval(nodes, o as usize, memo, leaf);
        }
        let v = |i: u32| memo[i as usize].clone().unwrap_or_default();
        let r = match nodes[target] {
            Node::Input(i) => leaf(self, Leaf::Input(i)),
            Node::Acc => leaf(self, Leaf::Acc),
            // `validate` guarantees reductions are computed first; never reached.
            Node::Reduce(..) => self.value(Reg::F32, "mov.f32", &f32_imm(f32::NAN)),
            Node::Const(bits) => self.value(Reg::F32, "mov.f32", &f32_imm(f32::from_bits(bits))),
            Node::Iota { start, step } => {
                let i = leaf(self, Leaf::Index);
                let fi = self.value(Reg::F64, "cvt.rn.f64.u32", &i);
                let scaled = self.value(Reg::F64, "mul.rn.f64", &format!("{fi}, {}", f64_imm(f64::from_bits(step))));
                let sum = self.value(Reg::F64, "add.rn.f64", &format!("{scaled}, {}", f64_imm(f64::from_bits(start))));
                self.value(Reg::F32, "cvt.rn.f32.f64", &sum)
            }
            Node::Rand { seed } => {
                let i = leaf(self, Leaf::Index);
                let i64r = self.value(Reg::B64, "cvt.u64.u32", &i);
                let bits = self.random_bits(seed, &i64r);
                let top = self.value(Reg::B64, "shr.u64", &format!("{bits}, 40"));
                let f = self.value(Reg::F32, "cvt.rn.f32.u64", &top);
                self.value(Reg::F32, "mul.rn.f32", &format!("{f}, {}", f32_imm(1.0 / 16_777_216.0)))
            }
            Node::Randn { seed } => {
                let i = leaf(self, Leaf::Index);
                let wide = self.value(Reg::B64, "cvt.u64.u32", &i);
                let c1 = self.value(Reg::B64, "shl.b64", &format!("{wide}, 1"));
                let c2 = self.value(Reg::B64, "add.u64", &format!("{c1}, 1"));
                let unit = |e: &mut Emitter, c: &str| {
                    let b = e.random_bits(seed, c);
                    let top = e.value(Reg::B64, "shr.u64", &format!("{b}, 11"));
                    let f = e.value(Reg::F64, "cvt.rn.f64.u64", &top);
                    e.value(Reg::F64, "mul.rn.f64", &format!("{f}, {}", f64_imm(1.0 / 9_007_199_254_740_992.0)))
                };
                let (u1, u2) = (unit(self, &c1), unit(self, &c2));
                // The interpreter's expression, in f64 throughout, with f64 ln and cos
                // accurate to a few ulp, so the f32 results round to the same values.
                let one_minus = self.value(Reg::F64, "sub.rn.f64", &format!("{}, {u1}", f64_imm(1.0)));
                let ln = self.ln_f64(&one_minus);
                let m2 = self.value(Reg::F64, "mul.rn.f64", &format!("{}, {ln}", f64_imm(-2.0)));
                let r = self.value(Reg::F64, "sqrt.rn.f64", &m2);
                let angle = self.value(Reg::F64, "mul.rn.f64", &format!("{}, {u2}", f64_imm(std::f64::consts::TAU)));
                let cos = self.cos_f64(&angle);
                let x = self.value(Reg::F64, "mul.rn.f64", &format!("{r}, {cos}"));
                self.value(Reg::F32, "cvt.rn.f32.f64", &x)
            }
            Node::Unary(op, a) => self.unary(op, &v(a)),
            Node::Binary(op, a, b) => self.binary(op, &v(a), &v(b)),
            Node::Select(c, t, f) => {
                let p = self.predicate("neu.f32", &v(c), &f32_imm(0.0));
                self.select(&p, &v(t), &v(f))
            }
        };
        memo[target] = Some(r.clone());
        r
    }

    /// `ln x` for a positive normal f64: `x = 2^e m` with `m` in `[sqrt(1/2), sqrt(2))`,
    /// `ln m = 2 atanh(s)`, `s = (m - 1) / (m + 1)`, `|s| < 0.172`, by its series to s^23.
    fn ln_f64(&mut self, x: &str) -> String {
        let bits = self.value(Reg::B64, "mov.b64", x);
        let biased = self.value(Reg::B64, "shr.u64", &format!("{bits}, 52"));
        let exp = self.value(Reg::B64, "and.b64", &format!("{biased}, 2047"));
        let exp32 = self.value(Reg::B32, "cvt.u32.u64", &exp);
        let e = self.value(Reg::B32, "sub.s32", &format!("{exp32}, 1023"));
        let mant = self.value(Reg::B64, "and.b64", &format!("{bits}, {}", 0x000F_FFFF_FFFF_FFFFu64));
        let mbits = self.value(Reg::B64, "or.b64", &format!("{mant}, {}", 0x3FF0_0000_0000_0000u64));
        let m = self.value(Reg::F64, "mov.b64", &mbits);
        let big = self.predicate("gt.f64", &m, &f64_imm(std::f64::consts::SQRT_2));
        let half = self.value(Reg::F64, "mul.rn.f64", &format!("{m}, {}", f64_imm(0.5)));
        let m = self.value(Reg::F64, "selp.f64", &format!("{half}, {m}, {big}"));
        let e1 = self.value(Reg::B32, "add.s32", &format!("{e}, 1"));
        let e = self.value(Reg::B32, "selp.b32", &format!("{e1}, {e}, {big}"));
        let num = self.value(Reg::F64, "sub.rn.f64", &format!("{m}, {}", f64_imm(1.0)));
        let den = self.value(Reg::F64, "add.rn.f64", &format!("{m}, {}", f64_imm(1.0)));
        let s = self.value(Reg::F64, "div.rn.f64", &format!("{num}, {den}"));
        let s2 = self.value(Reg::F64, "mul.rn.f64", &format!("{s}, {s}"));
        // atanh(s) / s = sum s^2k / (2k + 1), Horner from k = 11.
        let mut p = self.value(Reg::F64, "mov.f64", &f64_imm(1.0 / 23.0));
        for k in (0..11).rev() {
            p = self.value(Reg::F64, "fma.rn.f64", &format!("{p}, {s2}, {}", f64_imm(1.0 / (2 * k + 1) as f64)));
        }
        let two_s = self.value(Reg::F64, "add.rn.f64", &format!("{s}, {s}"));
        let ln_m = self.value(Reg::F64, "mul.rn.f64", &format!("{two_s}, {p}"));
        let ef = self.value(Reg::F64, "cvt.rn.f64.s32", &e);
        // ln 2 in two parts: e * LN2_HI is exact for |e| < 2^11.
        let lo = self.value(Reg::F64, "fma.rn.f64", &format!("{ef}, {}, {ln_m}", f64_imm(LN2_LO)));
        self.value(Reg::F64, "fma.rn.f64", &format!("{ef}, {}, {lo}", f64_imm(LN2_HI)))
    }

    /// `cos x` for `0 <= x < 2 pi` (f64): `x = k pi/2 + r`, `|r| <= pi/4`, then the Taylor
    /// series of cos or sin of `r` (to r^16 / r^17) with the quadrant's sign.
    fn cos_f64(&mut self, x: &str) -> String {
        let q = self.value(Reg::F64, "mul.rn.f64", &format!("{x}, {}", f64_imm(std::f64::consts::FRAC_2_PI)));
        let k = self.value(Reg::F64, "cvt.rni.f64.f64", &q);
        // pi/2 in two parts (Cody-Waite): r = x - k (HI + LO), k <= 4 keeps k * HI exact.
        let r = self.value(Reg::F64, "fma.rn.f64", &format!("{k}, {}, {x}", f64_imm(-std::f64::consts::FRAC_PI_2)));
        let r = self.value(Reg::F64, "fma.rn.f64", &format!("{k}, {}, {r}", f64_imm(-PI_2_LO)));
        let r2 = self.value(Reg::F64, "mul.rn.f64", &format!("{r}, {r}"));
        let factorial = |n: u32| (1..=n).map(f64::from).product::<f64>();
        // cos r = sum (-1)^j r^2j / (2j)!; sin r = r sum (-1)^j r^2j / (2j+1)!.
        let series = |e: &mut Emitter, odd: u32| {
            let term = |j: u32| if j.is_multiple_of(2) { 1.0 } else { -1.0 } / factorial(2 * j + odd);
            let mut p = e.value(Reg::F64, "mov.f64", &f64_imm(term(8)));
            for j in (0..8).rev() {
                p = e.value(Reg::F64, "fma.rn.f64", &format!("{p}, {r2}, {}", f64_imm(term(j))));
            }
            p
        };
        let cos_r = series(self, 0);
        let sin_p = series(self, 1);
        let sin_r = self.value(Reg::F64, "mul.rn.f64", &format!("{sin_p}, {r}"));
        let ki = self.value(Reg::B32, "cvt.rni.s32.f64", &k);
        let quadrant = self.value(Reg::B32, "and.b32", &format!("{ki}, 3"));
        // k mod 4 = 0: cos r, 1: -sin r, 2: -cos r, 3: sin r.
        let odd = self.value(Reg::B32, "and.b32", &format!("{quadrant}, 1"));
        let use_sin = self.predicate("ne.u32", &odd, "0");
        let base = self.value(Reg::F64, "selp.f64", &format!("{sin_r}, {cos_r}, {use_sin}"));
        let flip_q = self.value(Reg::B32, "add.u32", &format!("{quadrant}, 1"));
        let flip_bits = self.value(Reg::B32, "and.b32", &format!("{flip_q}, 2"));
        let flip = self.predicate("ne.u32", &flip_bits, "0");
        let neg = self.value(Reg::F64, "neg.f64", &base);
        self.value(Reg::F64, "selp.f64", &format!("{neg}, {base}, {flip}"))
    }

    /// `splitmix64(splitmix64(seed) + counter)` (see `cpu/random.rs`).
    fn random_bits(&mut self, seed: u64, counter: &str) -> String {
        let start = crate::backend::cpu::random::splitmix64(seed).wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.value(Reg::B64, "add.u64", &format!("{counter}, {start}"));
        for (shift, mul) in [(30, 0xBF58_476D_1CE4_E5B9u64), (27, 0x94D0_49BB_1331_11EB)] {
            let s = self.value(Reg::B64, "shr.u64", &format!("{z}, {shift}"));
            let x = self.value(Reg::B64, "xor.b64", &format!("{z}, {s}"));
            z = self.value(Reg::B64, "mul.lo.u64", &format!("{x}, {mul}"));
        }
        let s = self.value(Reg::B64, "shr.u64", &format!("{z}, 31"));
        self.value(Reg::B64, "xor.b64", &format!("{z}, {s}"))
    }

    /// One unary op (a composite as its expansion).
    fn unary(&mut self, op: UnaryOp, x: &str) -> String {
        match op.def() {
            OpDef::Prim(p) => self.unary_prim(p, x),
            OpDef::Composite(t) => self.formula(t, &[x]),
        }
    }

    /// One binary op (a composite as its expansion).
    fn binary(&mut self, op: BinaryOp, a: &str, b: &str) -> String {
        match op.def() {
            OpDef::Prim(p) => self.binary_prim(p, a, b),
            OpDef::Composite(t) => self.formula(t, &[a, b]),
        }
    }

    /// A composite's expansion over `operands`.
    fn formula(&mut self, t: &Term, operands: &[&str]) -> String {
        struct Ptx<'e, 'o> {
            e: &'e mut Emitter,
            operands: &'o [&'o str],
        }
        impl Algebra for Ptx<'_, '_> {
            type Value = String;
            type Error = Var;
            fn var(&mut self, var: Var) -> Result<String, Var> {
                match var {
                    Var::Operand(i) => self.operands.get(i as usize).map(|s| s.to_string()).ok_or(var),
                    Var::Result | Var::Grad => Err(var),
                }
            }
            fn constant(&mut self, c: f64) -> Result<String, Var> {
                Ok(f32_imm(c as f32))
            }
            fn unary(&mut self, op: UnaryOp, x: String) -> Result<String, Var> {
                Ok(self.e.unary(op, &x))
            }
            fn binary(&mut self, op: BinaryOp, x: String, y: String) -> Result<String, Var> {
                Ok(self.e.binary(op, &x, &y))
            }
            fn select(&mut self, c: String, t: String, f: String) -> Result<String, Var> {
                // NaN counts as nonzero, as `where` does.
                let p = self.e.predicate("neu.f32", &c, &f32_imm(0.0));
                Ok(self.e.select(&p, &t, &f))
            }
        }
        // The op table's tests check that expansions read only their operands.
        t.eval(&mut Ptx { e: self, operands }).unwrap_or_else(|var| panic!("an expansion reads {var:?}"))
    }

    /// `erf(x)`: the JIT's rational approximation (`cpu/jit/math.rs`, `Emit::erf`) with
    /// fused multiply-adds; NaN stays NaN.
    fn erf(&mut self, x: &str) -> String {
        const P: [f32; 7] = [
            -2.726_142_3e-10,
            2.770_681_4e-8,
            -2.101_024e-6,
            -5.692_506_4e-5,
            -7.349_906_3e-4,
            -2.954_600_2e-3,
            -1.609_603_3e-2,
        ];
        const Q: [f32; 5] = [-1.456_607_2e-5, -2.133_740_6e-4, -1.682_827e-3, -7.373_329e-3, -1.426_474e-2];
        let hi = self.value(Reg::F32, "min.f32", &format!("{x}, {}", f32_imm(4.0)));
        let c = self.value(Reg::F32, "max.f32", &format!("{hi}, {}", f32_imm(-4.0)));
        let x2 = self.value(Reg::F32, "mul.rn.f32", &format!("{c}, {c}"));
        let horner = |e: &mut Emitter, coefficients: &[f32]| {
            let mut acc = f32_imm(coefficients[0]);
            for &k in &coefficients[1..] {
                acc = e.value(Reg::F32, "fma.rn.f32", &format!("{acc}, {x2}, {}", f32_imm(k)));
            }
            acc
        };
        let p = horner(self, &P);
        let q = horner(self, &Q);
        let ratio = self.value(Reg::F32, "div.rn.f32", &format!("{p}, {q}"));
        let r = self.value(Reg::F32, "mul.rn.f32", &format!("{ratio}, {c}"));
        // `min`/`max` return the other operand for a NaN; put it back.
        let nan = self.predicate("nan.f32", x, x);
        self.select(&nan, x, &r)
    }

    fn unary_prim(&mut self, op: UnaryPrim, x: &str) -> String {
        let zero = f32_imm(0.0);
        let one = f32_imm(1.0);
        match op {
            UnaryPrim::Neg => self.value(Reg::F32, "neg.f32", x),
            UnaryPrim::Abs => self.value(Reg::F32, "abs.f32", x),
            UnaryPrim::Relu => {
                // `x < 0` is false for NaN, which passes through (as in the interpreter).
                let p = self.predicate("lt.f32", x, &zero);
                self.select(&p, &zero, x)
            }
            UnaryPrim::Sigmoid => {
                // e / (1 + e) with e = exp(-|x|) never overflows; mirrored for x >= 0.
                let a = self.value(Reg::F32, "abs.f32", x);
                let na = self.value(Reg::F32, "neg.f32", &a);
                let e = self.exp(&na);
                let den = self.value(Reg::F32, "add.rn.f32", &format!("{e}, {one}"));
                let neg_side = self.value(Reg::F32, "div.rn.f32", &format!("{e}, {den}"));
                let pos_side = self.value(Reg::F32, "div.rn.f32", &format!("{one}, {den}"));
                let p = self.predicate("lt.f32", x, &zero);
                self.select(&p, &neg_side, &pos_side)
            }
            UnaryPrim::Tanh => {
                // sign(x) (1 - e) / (1 + e), e = exp(-2|x|).
                let a = self.value(Reg::F32, "abs.f32", x);
                let m2 = self.value(Reg::F32, "mul.rn.f32", &format!("{a}, {}", f32_imm(-2.0)));
                let e = self.exp(&m2);
                let num = self.value(Reg::F32, "sub.rn.f32", &format!("{one}, {e}"));
                let den = self.value(Reg::F32, "add.rn.f32", &format!("{one}, {e}"));
                let t = self.value(Reg::F32, "div.rn.f32", &format!("{num}, {den}"));
                self.value(Reg::F32, "copysign.f32", &format!("{x}, {t}"))
            }
            UnaryPrim::Exp => self.exp(x),
            UnaryPrim::Log => {
                let l = self.value(Reg::F32, "lg2.approx.f32", x);
                self.value(Reg::F32, "mul.rn.f32", &format!("{l}, {}", f32_imm(std::f32::consts::LN_2)))
            }
            UnaryPrim::Sqrt => self.value(Reg::F32, "sqrt.rn.f32", x),
            UnaryPrim::Rsqrt => {
                let s = self.value(Reg::F32, "sqrt.rn.f32", x);
                self.value(Reg::F32, "rcp.rn.f32", &s)
            }
            UnaryPrim::Erf => self.erf(x),
        }
    }

    fn binary_prim(&mut self, op: BinaryPrim, a: &str, b: &str) -> String {
        let ab = format!("{a}, {b}");
        let truth = |e: &mut Emitter, cmp: &str| {
            let p = e.predicate(cmp, a, b);
            e.select(&p, &f32_imm(1.0), &f32_imm(0.0))
        };
        match op {
            BinaryPrim::Add => self.value(Reg::F32, "add.rn.f32", &ab),
            BinaryPrim::Sub => self.value(Reg::F32, "sub.rn.f32", &ab),
            BinaryPrim::Mul => self.value(Reg::F32, "mul.rn.f32", &ab),
            BinaryPrim::Div => self.value(Reg::F32, "div.rn.f32", &ab),
            BinaryPrim::Pow => self.pow(a, b),
            BinaryPrim::Maximum => self.nan_extreme(true, a, b),
            BinaryPrim::Minimum => self.nan_extreme(false, a, b),
            BinaryPrim::Eq => truth(self, "eq.f32"),
            // Unordered: NaN != anything is true.
            BinaryPrim::Ne => truth(self, "neu.f32"),
            BinaryPrim::Lt => truth(self, "lt.f32"),
            BinaryPrim::Le => truth(self, "le.f32"),
            BinaryPrim::Gt => truth(self, "gt.f32"),
            BinaryPrim::Ge => truth(self, "ge.f32"),
        }
    }

    /// The larger (`max`) or smaller of two values, NaN if either is (numpy.maximum, the
    /// interpreter's nan_max / nan_min): keeps `a` when it wins or is NaN.
    fn nan_extreme(&mut self, max: bool, a: &str, b: &str) -> String {
        let wins = self.predicate(if max { "ge.f32" } else { "le.f32" }, a, b);
        let nan = self.predicate("nan.f32", a, a);
        let keep = self.value(Reg::Pred, "or.pred", &format!("{wins}, {nan}"));
        self.select(&keep, a, b)
    }

    /// `powf`: `2^(b log2 |a|)`, negated for a negative base with an odd integer exponent,
    /// NaN for a negative base with a fractional one; `x^0 = 1^y = 1`.
    fn pow(&mut self, a: &str, b: &str) -> String {
        let one = f32_imm(1.0);
        let abs = self.value(Reg::F32, "abs.f32", a);
        let l = self.value(Reg::F32, "lg2.approx.f32", &abs);
        let t = self.value(Reg::F32, "mul.rn.f32", &format!("{b}, {l}"));
        let mag = self.value(Reg::F32, "ex2.approx.f32", &t);
        let bi = self.value(Reg::F32, "cvt.rzi.f32.f32", b);
        let is_int = self.predicate("eq.f32", &bi, b);
        let half = self.value(Reg::F32, "mul.rn.f32", &format!("{b}, {}", f32_imm(0.5)));
        let half_i = self.value(Reg::F32, "cvt.rzi.f32.f32", &half);
        let odd = self.predicate("neu.f32", &half_i, &half);
        let neg_mag = self.value(Reg::F32, "neg.f32", &mag);
        let signed = self.select(&odd, &neg_mag, &mag);
        let nan = f32_imm(f32::NAN);
        let negative_base = self.select(&is_int, &signed, &nan);
        let is_neg = self.predicate("lt.f32", a, &f32_imm(0.0));
        let r = self.select(&is_neg, &negative_base, &mag);
        let zero_exp = self.predicate("eq.f32", b, &f32_imm(0.0));
        let unit_base = self.predicate("eq.f32", a, &one);
        // (-1)^(+-inf) = 1, as in C's pow.
        let b_abs = self.value(Reg::F32, "abs.f32", b);
        let inf_exp = self.predicate("eq.f32", &b_abs, &f32_imm(f32::INFINITY));
        let unit_abs = self.predicate("eq.f32", &abs, &one);
        let minus_one_inf = self.value(Reg::Pred, "and.pred", &format!("{inf_exp}, {unit_abs}"));
        let trivial = self.value(Reg::Pred, "or.pred", &format!("{zero_exp}, {unit_base}"));
        let trivial = self.value(Reg::Pred, "or.pred", &format!("{trivial}, {minus_one_inf}"));
        self.select(&trivial, &one, &r)
    }

    /// Loads input `i` of element `offset` (an s32 element index).
    fn load(&mut self, base: &str, offset: &str) -> String {
        let addr = self.element_address(base, offset);
        self.value(Reg::F32, "ld.global.nc.f32", &format!("[{addr}]"))
    }

    /// This thread's global index (s32) and the grid's stride.
    fn global_thread(&mut self) -> (String, String) {
        let (ctaid, ntid, tid) = (self.special("%ctaid.x"), self.special("%ntid.x"), self.special("%tid.x"));
        let index = self.value(Reg::B32, "mad.lo.s32", &format!("{ctaid}, {ntid}, {tid}"));
        let nctaid = self.special("%nctaid.x");
        let stride = self.value(Reg::B32, "mul.lo.s32", &format!("{nctaid}, {ntid}"));
        (index, stride)
    }
}

const BLOCK: u32 = 256;
/// Grid-stride loops cap the grid here; more blocks than this add no parallelism.
const MAX_BLOCKS: usize = 65_535;

fn map(k: &MapKernel) -> Result<PtxKernel, PtxError> {
    let n = k.numel();
    check(n)?;
    check(k.output.span(&k.shape))?;
    for a in &k.inputs {
        check(a.span(&k.shape))?;
    }
    let dims = &k.shape[..];
    if let Some(axis) = transposed_axis(k) {
        return transpose(k, axis);
    }
    let flat = |a: &Access| a.is_contiguous_over(dims) || a.is_uniform_over(dims);
    let vector = n.is_multiple_of(4) && k.output.is_contiguous_over(dims) && k.inputs.iter().all(flat);
    let width = if vector { 4 } else { 1 };
    let work = n / width;

    let mut e = Emitter::default();
    let (out, inputs) = e.buffers(k.inputs.len());
    let (index, stride) = e.global_thread();
    e.counted_loop(("loop", "done"), &index, work, &stride, |e| map_body(e, k, vector, &index, &out, &inputs));
    let blocks = work.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    let comment = format!("map of {n} elements, {} per thread step", width);
    Ok(PtxKernel { text: e.finish(&comment, "", k.inputs.len() + 1), grid: (blocks, 1, 1), block: (BLOCK, 1, 1) })
}

/// One grid-stride step of a map: element `index` (or elements 4 index .. +3 when `vector`).
fn map_body(e: &mut Emitter, k: &MapKernel, vector: bool, index: &str, out: &str, inputs: &[String]) {
    let dims = &k.shape[..];
    if vector {
        // Element indices 4i..4i+3, contiguous everywhere: v4 loads and one v4 store.
        let first = e.value(Reg::B32, "shl.b32", &format!("{index}, 2"));
        let mut lanes: Vec<Vec<String>> = vec![Vec::new(); 4];
        for (access, base) in k.inputs.iter().zip(inputs) {
            if access.is_contiguous_over(dims) {
                let addr = e.element_address(base, &first);
                let regs: Vec<String> = (0..4).map(|_| e.reg(Reg::F32)).collect();
                e.op(format!("ld.global.nc.v4.f32 {{{}}}, [{addr}]", regs.join(", ")));
                for (lane, r) in lanes.iter_mut().zip(regs) {
                    lane.push(r);
                }
            } else {
                let off = e.value(Reg::B32, "mov.s32", &access.offset.to_string());
                let r = e.load(base, &off);
                for lane in &mut lanes {
                    lane.push(r.clone());
                }
            }
        }
        let mut results = Vec::new();
        for (lane, loaded) in lanes.iter().enumerate() {
            let mut leaf = |e: &mut Emitter, l: Leaf| match l {
                Leaf::Input(i) => loaded[i as usize].clone(),
                _ => e.value(Reg::B32, "add.s32", &format!("{first}, {lane}")),
            };
            results.push(e.eval(&k.nodes, k.nodes.len() - 1, &mut vec![None; k.nodes.len()], &mut leaf));
        }
        let addr = e.element_address(out, &first);
        e.op(format!("st.global.v4.f32 [{addr}], {{{}}}", results.join(", ")));
    } else {
        let all_flat =
            k.inputs.iter().chain([&k.output]).all(|a| a.is_contiguous_over(dims) || a.is_uniform_over(dims));
        let coords = if all_flat { vec![None; dims.len()] } else { e.coords(index, dims) };
        let offset_of = |e: &mut Emitter, a: &Access| {
            if a.is_contiguous_over(dims) {
                index.to_string()
            } else {
                e.dot(a.offset, &coords, &a.strides)
            }
        };
        let mut loaded = Vec::new();
        for (access, base) in k.inputs.iter().zip(inputs) {
            let off = offset_of(e, access);
            loaded.push(e.load(base, &off));
        }
        let mut leaf = |_: &mut Emitter, l: Leaf| match l {
            Leaf::Input(i) => loaded[i as usize].clone(),
            _ => index.to_string(),
        };
        let value = e.eval(&k.nodes, k.nodes.len() - 1, &mut vec![None; k.nodes.len()], &mut leaf);
        let off = offset_of(e, &k.output);
        let addr = e.element_address(out, &off);
        e.op(format!("st.global.f32 [{addr}], {value}"));
    }
}

/// What a node reads besides other nodes.
#[derive(Debug, Clone, Copy)]
enum Leaf {
    /// A kernel input at the current element.
    Input(u32),
    /// The matmul product at the current element.
    Acc,
    /// The current element's linear index in the iteration space (s32).
    Index,
}

/// Elements per thread up to which a row kernel keeps its row in registers between phases.
/// Measured on an H100 (16384x16384 softmax): re-reading the row from cache in each phase
/// (0.85 ms, as fast as PyTorch) beats keeping 16 elements per thread in registers (1.38 ms,
/// the register pressure halves the blocks per SM), so only short rows are kept.
const ROW_CACHE: usize = 4;

/// `acc ⊕ x` for a reduction: a sum, or NaN-propagating max / min (as the interpreter).
fn fold(e: &mut Emitter, op: ReduceOp, acc: &str, x: &str) -> String {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => e.value(Reg::F32, "add.rn.f32", &format!("{acc}, {x}")),
        ReduceOp::Max => e.nan_extreme(true, acc, x),
        ReduceOp::Min => e.nan_extreme(false, acc, x),
    }
}

fn identity(op: ReduceOp) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Max => f32::NEG_INFINITY,
        ReduceOp::Min => f32::INFINITY,
    }
}

/// One element of a row: its row index `r`, whether it exists (unrolled tails), and what
/// has been computed for it.
struct Element {
    r: String,
    valid: Option<String>,
    coords: Option<Vec<Option<String>>>,
    loads: Vec<Option<String>>,
    index: Option<String>,
    memo: Vec<Option<String>>,
}

/// The per-block facts of a row kernel.
struct RowKernel<'a> {
    k: &'a MapKernel,
    row_dims: Vec<usize>,
    row_strides: Vec<Vec<i64>>,
    in_ptrs: Vec<String>,
    in_bases: Vec<String>,
    index_base: String,
    index_strides: Vec<i64>,
}

impl RowKernel<'_> {
    fn element(&self, r: String, valid: Option<String>, reduced: &[(usize, String)]) -> Element {
        let mut memo = vec![None; self.k.nodes.len()];
        for (i, reg) in reduced {
            memo[*i] = Some(reg.clone());
        }
        Element { r, valid, coords: None, loads: vec![None; self.k.inputs.len()], index: None, memo }
    }

    /// The `width` consecutive elements of group `g` (element `g` when `width` is 1), with
    /// the inputs `target` needs loaded by one v4 load each.
    fn group(
        &self,
        e: &mut Emitter,
        g: &str,
        width: usize,
        target: usize,
        reduced: &[(usize, String)],
    ) -> Vec<Element> {
        if width == 1 {
            return vec![self.element(g.to_string(), None, reduced)];
        }
        let first = e.value(Reg::B32, "shl.b32", &format!("{g}, 2"));
        let mut els: Vec<Element> = (0..width)
            .map(|lane| {
                let r = e.value(Reg::B32, "add.s32", &format!("{first}, {lane}"));
                self.element(r, None, reduced)
            })
            .collect();
        let dims = &self.k.shape[..];
        for i in needed_inputs(&self.k.nodes, target, reduced) {
            if self.k.inputs[i].is_uniform_over(dims) {
                continue;
            }
            let off = e.value(Reg::B32, "add.s32", &format!("{}, {first}", self.in_bases[i]));
            let addr = e.element_address(&self.in_ptrs[i], &off);
            let regs: Vec<String> = (0..width).map(|_| e.reg(Reg::F32)).collect();
            e.op(format!("ld.global.nc.v4.f32 {{{}}}, [{addr}]", regs.join(", ")));
            for (el, r) in els.iter_mut().zip(regs) {
                el.loads[i] = Some(r);
            }
        }
        els
    }

    /// Node `target` at element `el`.
    fn value(&self, e: &mut Emitter, el: &mut Element, target: usize) -> String {
        let Element { r, valid, coords, loads, index, memo } = el;
        let mut leaf = |e: &mut Emitter, l: Leaf| -> String {
            let coords = coords.get_or_insert_with(|| e.coords(r, &self.row_dims)).clone();
            match l {
                Leaf::Input(i) => {
                    let i = i as usize;
                    if let Some(x) = &loads[i] {
                        return x.clone();
                    }
                    let part = e.dot(0, &coords, &self.row_strides[i]);
                    let off = e.value(Reg::B32, "add.s32", &format!("{}, {part}", self.in_bases[i]));
                    let x = match valid {
                        None => e.load(&self.in_ptrs[i], &off),
                        Some(p) => {
                            // Past the row's end (an unrolled tail): no load, a harmless 0.
                            let x = e.value(Reg::F32, "mov.f32", &f32_imm(0.0));
                            let addr = e.element_address(&self.in_ptrs[i], &off);
                            e.op(format!("@{p} ld.global.nc.f32 {x}, [{addr}]"));
                            x
                        }
                    };
                    loads[i] = Some(x.clone());
                    x
                }
                Leaf::Index | Leaf::Acc => index
                    .get_or_insert_with(|| {
                        let part = e.dot(0, &coords, &self.index_strides);
                        e.value(Reg::B32, "add.s32", &format!("{}, {part}", self.index_base))
                    })
                    .clone(),
            }
        };
        e.eval(&self.k.nodes, target, memo, &mut leaf)
    }
}

/// The inputs node `target` reads, through nodes not already computed (`reduced`).
fn needed_inputs(nodes: &[Node], target: usize, reduced: &[(usize, String)]) -> Vec<usize> {
    let mut seen = vec![false; nodes.len()];
    let mut stack = vec![target];
    let mut inputs = Vec::new();
    while let Some(n) = stack.pop() {
        if seen[n] || reduced.iter().any(|(i, _)| *i == n) {
            continue;
        }
        seen[n] = true;
        if let Node::Input(i) = nodes[n] {
            if !inputs.contains(&(i as usize)) {
                inputs.push(i as usize);
            }
        }
        stack.extend(nodes[n].operands().into_iter().map(|o| o as usize));
    }
    inputs
}

/// Combines every thread's `acc` of the block; afterwards every thread holds the result.
fn block_reduce(e: &mut Emitter, op: ReduceOp, acc: &str, warps: u32, lane: &str, warp: &str, shared: &str) {
    for shift in [16, 8, 4, 2, 1] {
        let bits = e.value(Reg::B32, "mov.b32", acc);
        let other = e.value(Reg::B32, "shfl.sync.bfly.b32", &format!("{bits}, {shift}, 31, -1"));
        let other = e.value(Reg::F32, "mov.b32", &other);
        let folded = fold(e, op, acc, &other);
        e.op(format!("mov.f32 {acc}, {folded}"));
    }
    if warps > 1 {
        let first_lane = e.predicate("eq.u32", lane, "0");
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{warp}, 4, {shared}"));
        e.op(format!("@{first_lane} st.shared.f32 [{slot}], {acc}"));
        e.op("bar.sync 0");
        // Every thread folds the partials in the same order: the same result everywhere.
        e.op(format!("mov.f32 {acc}, {}", f32_imm(identity(op))));
        for w in 0..warps {
            let t = e.value(Reg::F32, "ld.shared.f32", &format!("[{shared}+{}]", w * 4));
            let folded = fold(e, op, acc, &t);
            e.op(format!("mov.f32 {acc}, {folded}"));
        }
        // The partials are read by all before the next reduction overwrites them.
        e.op("bar.sync 0");
    }
}

/// A kernel that owns rows: one block per row; each in-row reduction is a phase over the
/// row (its elements kept in registers when they fit), then the row's outputs are written,
/// or reduced to one value.
/// For a map whose output is contiguous and whose one non-uniform input is read with unit
/// stride along an axis other than the last (a transpose, or a permute moving the fastest
/// axis), that axis; such maps go through shared-memory tiles so that reads and writes are
/// both coalesced.
fn transposed_axis(k: &MapKernel) -> Option<usize> {
    let dims = &k.shape[..];
    let rank = dims.len();
    let last = rank.checked_sub(1)?;
    let mut strided = k.inputs.iter().filter(|a| !a.is_uniform_over(dims));
    let (input, None) = (strided.next()?, strided.next()) else { return None };
    let axis = (0..last).rev().find(|&a| input.strides[a] == 1 && dims[a] > 1)?;
    let batch: usize = (0..rank).filter(|&a| a != axis && a != last).map(|a| dims[a]).product();
    let tiled = k.output.is_contiguous_over(dims) && input.strides[last] != 1 && dims[last] >= 8 && dims[axis] >= 8;
    (tiled && batch <= 65_535 && dims[axis].div_ceil(TILE) <= 65_535).then_some(axis)
}

/// The strides of `axes` only.
fn pick(strides: &[i64], axes: &[usize]) -> Vec<i64> {
    axes.iter().map(|&i| strides[i]).collect()
}

/// Tile side of the shared-memory transpose (a block is `TILE x 8` threads).
const TILE: usize = 32;

/// A map through 32x32 shared-memory tiles: a block reads a tile along the input's fast
/// axis (`axis`) and writes it along the output's (the last), both coalesced; the
/// expression is applied as the tile is written.
fn transpose(k: &MapKernel, axis: usize) -> Result<PtxKernel, PtxError> {
    let dims = &k.shape[..];
    let last = dims.len() - 1;
    let batch_axes: Vec<usize> = (0..dims.len()).filter(|&a| a != axis && a != last).collect();
    let batch_dims: Vec<usize> = batch_axes.iter().map(|&a| dims[a]).collect();
    let full = gt_ir::kernel::row_major_strides(dims);
    let mut e = Emitter::default();
    let (out, inputs) = e.buffers(k.inputs.len());
    let (tx, ty) = (e.special("%tid.x"), e.special("%tid.y"));
    let (bx, by, bz) = (e.special("%ctaid.x"), e.special("%ctaid.y"), e.special("%ctaid.z"));
    let batch = e.coords(&bz, &batch_dims);
    let bases: Vec<String> = k.inputs.iter().map(|a| e.dot(a.offset, &batch, &pick(&a.strides, &batch_axes))).collect();
    let out_base = e.dot(k.output.offset, &batch, &pick(&k.output.strides, &batch_axes));
    let tile = e.value(Reg::B32, "mov.u32", "gt_tile");
    let a0 = e.value(Reg::B32, "mul.lo.u32", &format!("{by}, {TILE}"));
    let l0 = e.value(Reg::B32, "mul.lo.u32", &format!("{bx}, {TILE}"));
    let strided = k.inputs.iter().position(|a| !a.is_uniform_over(dims)).unwrap_or(0);
    let (sa, sl) = (k.inputs[strided].strides[axis], k.inputs[strided].strides[last]);
    // Read: threads along `axis` (unit stride), rows of the tile along `last`.
    let ai = e.value(Reg::B32, "add.u32", &format!("{a0}, {tx}"));
    let a_ok = e.predicate("lt.s32", &ai, &dims[axis].to_string());
    for j in 0..TILE / 8 {
        let li = e.value(Reg::B32, "add.u32", &format!("{l0}, {ty}"));
        let li = e.value(Reg::B32, "add.u32", &format!("{li}, {}", j * 8));
        let l_ok = e.predicate("lt.s32", &li, &dims[last].to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{a_ok}, {l_ok}"));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{ai}, {sa}, {}", bases[strided]));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{li}, {sl}, {off}"));
        let x = e.value(Reg::F32, "mov.f32", &f32_imm(0.0));
        let addr = e.element_address(&inputs[strided], &off);
        e.op(format!("@{ok} ld.global.nc.f32 {x}, [{addr}]"));
        // tile[l][a], rows padded to TILE + 1 against bank conflicts.
        let row = e.value(Reg::B32, "add.u32", &format!("{ty}, {}", j * 8));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{row}, {}, {tx}", TILE + 1));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{slot}, 4, {tile}"));
        e.op(format!("st.shared.f32 [{slot}], {x}"));
    }
    e.op("bar.sync 0");
    // Write: threads along `last`.
    let lo = e.value(Reg::B32, "add.u32", &format!("{l0}, {tx}"));
    let l_ok = e.predicate("lt.s32", &lo, &dims[last].to_string());
    for j in 0..TILE / 8 {
        let row = e.value(Reg::B32, "add.u32", &format!("{ty}, {}", j * 8));
        let ao = e.value(Reg::B32, "add.u32", &format!("{a0}, {row}"));
        let a_ok = e.predicate("lt.s32", &ao, &dims[axis].to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{a_ok}, {l_ok}"));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{tx}, {}, {row}", TILE + 1));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{slot}, 4, {tile}"));
        let x = e.value(Reg::F32, "ld.shared.f32", &format!("[{slot}]"));
        let off = e.value(Reg::B32, "mad.lo.s32", &format!("{ao}, {}, {out_base}", k.output.strides[axis]));
        let off = e.value(Reg::B32, "add.s32", &format!("{off}, {lo}"));
        let mut leaf = |e: &mut Emitter, l: Leaf| match l {
            Leaf::Input(i) if i as usize == strided => x.clone(),
            // Uniform inputs: the one element they read.
            Leaf::Input(i) => {
                let o = e.value(Reg::B32, "mov.s32", &k.inputs[i as usize].offset.to_string());
                e.load(&inputs[i as usize], &o)
            }
            _ => {
                // Linear index: the batch part plus this element's (axis, last) part.
                let b = e.dot(0, &batch, &pick(&full, &batch_axes));
                let i = e.value(Reg::B32, "mad.lo.s32", &format!("{ao}, {}, {b}", full[axis]));
                e.value(Reg::B32, "add.s32", &format!("{i}, {lo}"))
            }
        };
        let value = e.eval(&k.nodes, k.nodes.len() - 1, &mut vec![None; k.nodes.len()], &mut leaf);
        let addr = e.element_address(&out, &off);
        e.op(format!("@{ok} st.global.f32 [{addr}], {value}"));
    }
    let globals = format!(".shared .align 4 .b8 gt_tile[{}];\n\n", TILE * (TILE + 1) * 4);
    let comment = format!("tiled transpose of axis {axis} with the last, {TILE}x{TILE} tiles, {} elements", k.numel());
    let grid = (
        dims[last].div_ceil(TILE) as u32,
        dims[axis].div_ceil(TILE) as u32,
        batch_dims.iter().product::<usize>() as u32,
    );
    Ok(PtxKernel { text: e.finish(&comment, &globals, k.inputs.len() + 1), grid, block: (TILE as u32, 8, 1) })
}

fn rows(k: &MapKernel) -> Result<PtxKernel, PtxError> {
    check(k.numel())?;
    check(k.output.span(&k.shape))?;
    for a in &k.inputs {
        check(a.span(&k.shape))?;
    }
    let (outputs, row_len) = k.extents();
    let dims = &k.shape[..];
    let threads = (row_len / 8).next_power_of_two().clamp(32, 1024) as u32;
    let warps = threads / 32;
    let per = row_len.div_ceil(threads as usize);
    let reductions: Vec<usize> = (0..k.nodes.len()).filter(|&i| matches!(k.nodes[i], Node::Reduce(..))).collect();
    let cached = !reductions.is_empty() && per <= ROW_CACHE;
    // Looped rows along the last axis read (and write) 4 consecutive elements at a time
    // when every strided buffer has unit stride there and 16-byte aligned rows.
    let last_axis = dims.len().saturating_sub(1);
    let aligned = |a: &Access| {
        a.offset % 4 == 0 && (0..dims.len()).all(|i| i == last_axis || a.strides[i] % 4 == 0 || dims[i] == 1)
    };
    let unit = |a: &Access| a.is_uniform_over(dims) || (a.strides[last_axis] == 1 && aligned(a));
    let vector = !cached
        && k.rows == [last_axis]
        && row_len.is_multiple_of(4)
        && k.inputs.iter().all(unit)
        && (k.reduce.is_some() || (k.output.strides[last_axis] == 1 && aligned(&k.output)));
    let width = if vector { 4 } else { 1 };
    let last = k.nodes.len() - 1;
    let kept_axes: Vec<usize> = (0..dims.len()).filter(|i| !k.rows.contains(i)).collect();
    let kept_dims: Vec<usize> = kept_axes.iter().map(|&i| dims[i]).collect();
    let full = gt_ir::kernel::row_major_strides(dims);

    let mut e = Emitter::default();
    let (out, in_ptrs) = e.buffers(k.inputs.len());
    let row = e.special("%ctaid.x");
    let tid = e.special("%tid.x");
    let lane = e.value(Reg::B32, "and.b32", &format!("{tid}, 31"));
    let warp = e.value(Reg::B32, "shr.u32", &format!("{tid}, 5"));
    let shared = e.value(Reg::B32, "mov.u32", "gt_partials");
    let kept = e.coords(&row, &kept_dims);
    let in_bases = k.inputs.iter().map(|a| e.dot(a.offset, &kept, &pick(&a.strides, &kept_axes))).collect();
    let out_base = e.dot(k.output.offset, &kept, &pick(&k.output.strides, &kept_axes));
    let index_base = e.dot(0, &kept, &pick(&full, &kept_axes));
    let rk = RowKernel {
        k,
        row_dims: k.rows.iter().map(|&i| dims[i]).collect(),
        row_strides: k.inputs.iter().map(|a| pick(&a.strides, &k.rows)).collect(),
        in_ptrs,
        in_bases,
        index_base,
        index_strides: pick(&full, &k.rows),
    };
    let out_row_strides = pick(&k.output.strides, &k.rows);

    // Cached: this thread's elements tid + j * threads, unrolled, kept across phases.
    let mut elements: Vec<Element> = Vec::new();
    if cached {
        for j in 0..per {
            let r = e.value(Reg::B32, "add.s32", &format!("{tid}, {}", j * threads as usize));
            let valid = e.predicate("lt.s32", &r, &row_len.to_string());
            elements.push(rk.element(r, Some(valid), &[]));
        }
    }
    // Folds node `target` over the row into a block-wide result in every thread.
    let mut reduced: Vec<(usize, String)> = Vec::new();
    let phase =
        |e: &mut Emitter, op: ReduceOp, target: usize, reduced: &[(usize, String)], elements: &mut Vec<Element>| {
            let acc = e.value(Reg::F32, "mov.f32", &f32_imm(identity(op)));
            if cached {
                for el in elements.iter_mut() {
                    let x = rk.value(e, el, target);
                    let folded = fold(e, op, &acc, &x);
                    let valid = el.valid.clone().unwrap_or_default();
                    e.op(format!("selp.f32 {acc}, {folded}, {acc}, {valid}"));
                }
            } else {
                let r = e.value(Reg::B32, "mov.u32", &tid);
                e.counted_loop(("fold", "folded"), &r, row_len / width, &threads.to_string(), |e| {
                    for mut el in rk.group(e, &r, width, target, reduced) {
                        let x = rk.value(e, &mut el, target);
                        let folded = fold(e, op, &acc, &x);
                        e.op(format!("mov.f32 {acc}, {folded}"));
                    }
                });
            }
            block_reduce(e, op, &acc, warps, &lane, &warp, &shared);
            if op == ReduceOp::Mean {
                // 0 / 0 makes the mean of nothing NaN, as in the interpreter.
                e.op(format!("div.rn.f32 {acc}, {acc}, {}", f32_imm(row_len as f32)));
            }
            acc
        };
    for &i in &reductions {
        let Node::Reduce(op, a) = k.nodes[i] else { continue };
        let result = phase(&mut e, op, a as usize, &reduced, &mut elements);
        for el in &mut elements {
            el.memo[i] = Some(result.clone());
        }
        reduced.push((i, result));
    }
    let finish = e.label("finish");
    match k.reduce {
        Some(op) => {
            let acc = phase(&mut e, op, last, &reduced, &mut elements);
            let not_first = e.predicate("ne.u32", &tid, "0");
            e.op(format!("@{not_first} bra {finish}"));
            let addr = e.element_address(&out, &out_base);
            e.op(format!("st.global.f32 [{addr}], {acc}"));
        }
        None => {
            let store = |e: &mut Emitter, el: &mut Element| {
                let x = rk.value(e, el, last);
                let coords = el.coords.get_or_insert_with(|| e.coords(&el.r, &rk.row_dims)).clone();
                let part = e.dot(0, &coords, &out_row_strides);
                let off = e.value(Reg::B32, "add.s32", &format!("{out_base}, {part}"));
                let addr = e.element_address(&out, &off);
                let guard = el.valid.as_ref().map(|p| format!("@{p} ")).unwrap_or_default();
                e.op(format!("{guard}st.global.f32 [{addr}], {x}"));
            };
            if cached {
                for el in &mut elements {
                    store(&mut e, el);
                }
            } else {
                let r = e.value(Reg::B32, "mov.u32", &tid);
                e.counted_loop(("store", "stored"), &r, row_len / width, &threads.to_string(), |e| {
                    if width == 4 {
                        // Four consecutive elements, one v4 store.
                        let mut values = Vec::new();
                        for mut el in rk.group(e, &r, width, last, &reduced) {
                            values.push(rk.value(e, &mut el, last));
                        }
                        let first = e.value(Reg::B32, "shl.b32", &format!("{r}, 2"));
                        let off = e.value(Reg::B32, "add.s32", &format!("{out_base}, {first}"));
                        let addr = e.element_address(&out, &off);
                        e.op(format!("st.global.v4.f32 [{addr}], {{{}}}", values.join(", ")));
                    } else {
                        let mut el = rk.element(r.clone(), None, &reduced);
                        store(e, &mut el);
                    }
                });
            }
        }
    }
    e.place(&finish);
    let globals = format!(".shared .align 4 .b8 gt_partials[{}];\n\n", warps * 4);
    let comment = format!(
        "rows: {outputs} rows of {row_len}, {threads} threads per row, {} in-row reductions{}{}",
        reductions.len(),
        k.reduce.map(|op| format!(", then {}", op.mnemonic())).unwrap_or_default(),
        if cached {
            ", row kept in registers"
        } else if vector {
            ", 4 elements per load"
        } else {
            ""
        }
    );
    Ok(PtxKernel {
        text: e.finish(&comment, &globals, k.inputs.len() + 1),
        grid: (outputs as u32, 1, 1),
        block: (threads, 1, 1),
    })
}

/// One product element a matmul thread accumulates: its row and column in the block tile,
/// each a base register plus a constant (few registers live through the main loop), and
/// its accumulator register.
struct Product {
    row: (String, usize),
    col: (String, usize),
    acc: String,
}

/// Loads `count` consecutive f32 from shared memory at `base + byte`, in v4/v2/v1 pieces.
fn shared_vector(e: &mut Emitter, base: &str, byte: usize, count: usize) -> Vec<String> {
    let mut regs = Vec::new();
    let mut i = 0;
    while i < count {
        let w = [4, 2, 1].into_iter().find(|&w| count - i >= w).unwrap_or(1);
        let rs: Vec<String> = (0..w).map(|_| e.reg(Reg::F32)).collect();
        let at = byte + i * 4;
        if w == 1 {
            e.op(format!("ld.shared.f32 {}, [{base}+{at}]", rs[0]));
        } else {
            e.op(format!("ld.shared.v{w}.f32 {{{}}}, [{base}+{at}]", rs.join(", ")));
        }
        regs.extend(rs);
        i += w;
    }
    regs
}

/// A matmul tiling: block tile `bm x bn`, `tm x tn` outputs per thread, `bk` deep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiling {
    /// Block tile rows.
    pub bm: usize,
    /// Block tile columns.
    pub bn: usize,
    /// Rows per thread.
    pub tm: usize,
    /// Columns per thread.
    pub tn: usize,
    /// Depth of one shared-memory stage.
    pub bk: usize,
    /// Padding of each shared-memory tile row (elements), against bank conflicts.
    pub pad: usize,
    /// TF32 tensor cores (`mma.sync m16n8k8`, warps of 64x32) instead of FMA.
    pub tensor_cores: bool,
}

impl Tiling {
    /// The tiling used for an `m x n` result: big tiles for big matrices, small ones so that
    /// small products still spread over many blocks.
    pub fn for_shape(m: usize, n: usize) -> Tiling {
        let fma = |bm, tm, bk| Tiling { bm, bn: bm, tm, tn: tm, bk, pad: 0, tensor_cores: false };
        if m * n >= 1 << 20 {
            fma(128, 8, 8)
        } else if m * n >= 1 << 17 {
            fma(64, 4, 16)
        } else {
            fma(32, 2, 16)
        }
    }

    /// The TF32 tensor-core tiling: 128x128x16 per block, 8 warps of 64x32; rows padded by
    /// 8 so the fragment reads hit 32 distinct banks.
    pub fn tensor_cores() -> Tiling {
        Tiling { bm: 128, bn: 128, tm: 8, tn: 8, bk: 16, pad: 8, tensor_cores: true }
    }

    fn threads(self) -> usize {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
}

fn matmul(k: &MatMulKernel) -> Result<PtxKernel, PtxError> {
    let nb = k.batch.len();
    let mut lhs_dims = k.batch.clone();
    lhs_dims.extend([k.m, k.k]);
    let mut rhs_dims = k.batch.clone();
    rhs_dims.extend([k.k, k.n]);
    check(k.lhs.span(&lhs_dims))?;
    check(k.rhs.span(&rhs_dims))?;
    check(k.batch_count().saturating_mul(k.m).saturating_mul(k.n))?;
    let mut out_dims = k.batch.clone();
    out_dims.extend([k.m, k.n]);
    for a in &k.epilogue_inputs {
        check(a.span(&out_dims))?;
    }
    let t = if k.precision == Precision::Tf32 { Tiling::tensor_cores() } else { Tiling::for_shape(k.m, k.n) };
    let threads = t.threads();
    let (lda, ldb) = (t.bm + t.pad, t.bn + t.pad);
    let (sm, sk) = (k.lhs.strides[nb], k.lhs.strides[nb + 1]);
    let (skb, snb) = (k.rhs.strides[nb], k.rhs.strides[nb + 1]);

    let mut e = Emitter::default();
    let out = e.param_pointer("gt_param_0");
    let a_ptr = e.param_pointer("gt_param_1");
    let b_ptr = e.param_pointer("gt_param_2");
    let epi_ptrs: Vec<String> =
        (0..k.epilogue_inputs.len()).map(|i| e.param_pointer(&format!("gt_param_{}", i + 3))).collect();
    let tid = e.special("%tid.x");
    let (bx, by, bz) = (e.special("%ctaid.x"), e.special("%ctaid.y"), e.special("%ctaid.z"));
    let row0 = e.value(Reg::B32, "mul.lo.s32", &format!("{by}, {}", t.bm));
    let col0 = e.value(Reg::B32, "mul.lo.s32", &format!("{bx}, {}", t.bn));
    let batch_coords = e.coords(&bz, &k.batch);
    let a_base = e.dot(k.lhs.offset, &batch_coords, &k.lhs.strides[..nb]);
    let b_base = e.dot(k.rhs.offset, &batch_coords, &k.rhs.strides[..nb]);
    let out_base = e.value(Reg::B32, "mul.lo.s32", &format!("{bz}, {}", k.m * k.n));
    // Per epilogue input: its batch offset and its (row, column) strides.
    let epi_bases: Vec<(String, [i64; 2])> = k
        .epilogue_inputs
        .iter()
        .map(|a| (e.dot(a.offset, &batch_coords, &a.strides[..nb]), [a.strides[nb], a.strides[nb + 1]]))
        .collect();

    // Which tile elements this thread loads: A (row am, column ak) and B (row bk, column bn).
    let ak = e.value(Reg::B32, "rem.u32", &format!("{tid}, {}", t.bk));
    let am0 = e.value(Reg::B32, "div.u32", &format!("{tid}, {}", t.bk));
    let bn = e.value(Reg::B32, "rem.u32", &format!("{tid}, {}", t.bn));
    let bk0 = e.value(Reg::B32, "div.u32", &format!("{tid}, {}", t.bn));
    let loads_a = t.bm * t.bk / threads;
    let loads_b = t.bk * t.bn / threads;
    let a_sh = e.value(Reg::B32, "mov.u32", "gt_tile_a");
    let b_sh = e.value(Reg::B32, "mov.u32", "gt_tile_b");
    // Per load: the element offset at k0 = 0 (advanced each stage), its row/col bound check,
    // and its shared-memory slot.
    struct Load {
        offset: String,
        in_range: String,
        k: String,
        slot: String,
    }
    // A tile element at (`fixed`, `k`) of one operand: `fixed` is a row of A or a column of
    // B (bound and stride given), `k` the contracted index; its shared slot is `k * ld + local`.
    let tile_load = |e: &mut Emitter,
                     local: &str,
                     origin: &str,
                     bound: usize,
                     stride: i64,
                     k: &str,
                     k_stride: i64,
                     base: &str,
                     ld: usize,
                     sh: &str| {
        let fixed = e.value(Reg::B32, "add.s32", &format!("{origin}, {local}"));
        let in_range = e.predicate("lt.s32", &fixed, &bound.to_string());
        let fixed_off = e.value(Reg::B32, "mad.lo.s32", &format!("{fixed}, {stride}, {base}"));
        let offset = e.value(Reg::B32, "mad.lo.s32", &format!("{k}, {k_stride}, {fixed_off}"));
        let kk = e.value(Reg::B32, "mov.s32", k);
        let idx = e.value(Reg::B32, "mad.lo.s32", &format!("{k}, {ld}, {local}"));
        let slot = e.value(Reg::B32, "mad.lo.u32", &format!("{idx}, 4, {sh}"));
        Load { offset, in_range, k: kk, slot }
    };
    let a_loads: Vec<Load> = (0..loads_a)
        .map(|j| {
            let am = e.value(Reg::B32, "add.s32", &format!("{am0}, {}", j * threads / t.bk));
            tile_load(&mut e, &am, &row0, k.m, sm, &ak, sk, &a_base, lda, &a_sh)
        })
        .collect();
    let b_loads: Vec<Load> = (0..loads_b)
        .map(|j| {
            let bk = e.value(Reg::B32, "add.s32", &format!("{bk0}, {}", j * threads / t.bn));
            tile_load(&mut e, &bn, &col0, k.n, snb, &bk, skb, &b_base, ldb, &b_sh)
        })
        .collect();
    // What this thread accumulates, and the code of one stage's products.
    let mut products: Vec<Product> = Vec::new();
    let compute: Box<dyn Fn(&mut Emitter)> = if t.tensor_cores {
        // Warp w owns rows 64 (w / 4) .. +64 and columns 32 (w % 4) .. +32 of the block tile:
        // 4 x 4 mma tiles of 16x8. Fragment layouts (PTX ISA, m16n8k8 .tf32), with g = lane / 4
        // and q = lane % 4: A a0..a3 = (g, q), (g+8, q), (g, q+4), (g+8, q+4); B b0, b1 =
        // (k q, n g), (k q+4, n g); D d0..d3 = (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1).
        let lane = e.value(Reg::B32, "and.b32", &format!("{tid}, 31"));
        let warp = e.value(Reg::B32, "shr.u32", &format!("{tid}, 5"));
        let g = e.value(Reg::B32, "shr.u32", &format!("{lane}, 2"));
        let q = e.value(Reg::B32, "and.b32", &format!("{lane}, 3"));
        let wm = e.value(Reg::B32, "shr.u32", &format!("{warp}, 2"));
        let wm = e.value(Reg::B32, "mul.lo.u32", &format!("{wm}, 64"));
        let wn = e.value(Reg::B32, "and.b32", &format!("{warp}, 3"));
        let wn = e.value(Reg::B32, "mul.lo.u32", &format!("{wn}, 32"));
        let frag = |e: &mut Emitter, ld: usize, origin: &str, sh: &str| {
            let idx = e.value(Reg::B32, "mad.lo.u32", &format!("{q}, {ld}, {origin}"));
            let idx = e.value(Reg::B32, "add.u32", &format!("{idx}, {g}"));
            e.value(Reg::B32, "mad.lo.u32", &format!("{idx}, 4, {sh}"))
        };
        let (a_frag, b_frag) = (frag(&mut e, lda, &wm, &a_sh), frag(&mut e, ldb, &wn, &b_sh));
        let acc: Vec<Vec<[String; 4]>> = (0..4)
            .map(|_| (0..4).map(|_| std::array::from_fn(|_| e.value(Reg::F32, "mov.f32", &f32_imm(0.0)))).collect())
            .collect();
        let row_base = e.value(Reg::B32, "add.u32", &format!("{wm}, {g}"));
        let col_base = e.value(Reg::B32, "mad.lo.u32", &format!("{q}, 2, {wn}"));
        for (mi, row) in acc.iter().enumerate() {
            for (ni, d) in row.iter().enumerate() {
                for (r, reg) in d.iter().enumerate() {
                    let at = (mi * 16 + 8 * (r / 2), ni * 8 + r % 2);
                    products.push(Product {
                        row: (row_base.clone(), at.0),
                        col: (col_base.clone(), at.1),
                        acc: reg.clone(),
                    });
                }
            }
        }
        let bk = t.bk;
        Box::new(move |e: &mut Emitter| {
            let tf32 = |e: &mut Emitter, base: &str, byte: usize| {
                let x = e.value(Reg::F32, "ld.shared.f32", &format!("[{base}+{byte}]"));
                e.value(Reg::B32, "cvt.rna.tf32.f32", &x)
            };
            for k8 in 0..bk / 8 {
                let a: Vec<Vec<String>> = (0..4)
                    .map(|mi| {
                        let at = (k8 * 8 * lda + mi * 16) * 4;
                        [at, at + 32, at + 16 * lda, at + 16 * lda + 32].iter().map(|&o| tf32(e, &a_frag, o)).collect()
                    })
                    .collect();
                let b: Vec<Vec<String>> = (0..4)
                    .map(|ni| {
                        let at = (k8 * 8 * ldb + ni * 8) * 4;
                        [at, at + 16 * ldb].iter().map(|&o| tf32(e, &b_frag, o)).collect()
                    })
                    .collect();
                for (mi, row) in acc.iter().enumerate() {
                    for (ni, d) in row.iter().enumerate() {
                        let d = d.join(", ");
                        e.op(format!(
                            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{d}}}, {{{}}}, {{{}}}, {{{d}}}",
                            a[mi].join(", "),
                            b[ni].join(", ")
                        ));
                    }
                }
            }
        })
    } else {
        let tx = e.value(Reg::B32, "rem.u32", &format!("{tid}, {}", t.bn / t.tn));
        let ty = e.value(Reg::B32, "div.u32", &format!("{tid}, {}", t.bn / t.tn));
        let a_read = e.value(Reg::B32, "mad.lo.u32", &format!("{ty}, {}, {a_sh}", t.tm * 4));
        let b_read = e.value(Reg::B32, "mad.lo.u32", &format!("{tx}, {}, {b_sh}", t.tn * 4));
        let acc: Vec<Vec<String>> =
            (0..t.tm).map(|_| (0..t.tn).map(|_| e.value(Reg::F32, "mov.f32", &f32_imm(0.0))).collect()).collect();
        let row_base = e.value(Reg::B32, "mul.lo.u32", &format!("{ty}, {}", t.tm));
        let col_base = e.value(Reg::B32, "mul.lo.u32", &format!("{tx}, {}", t.tn));
        for (i, row) in acc.iter().enumerate() {
            for (j, c) in row.iter().enumerate() {
                products.push(Product { row: (row_base.clone(), i), col: (col_base.clone(), j), acc: c.clone() });
            }
        }
        Box::new(move |e: &mut Emitter| {
            for kk in 0..t.bk {
                let a = shared_vector(e, &a_read, kk * lda * 4, t.tm);
                let b = shared_vector(e, &b_read, kk * ldb * 4, t.tn);
                for (i, row) in acc.iter().enumerate() {
                    for (j, c) in row.iter().enumerate() {
                        e.op(format!("fma.rn.f32 {c}, {}, {}, {c}", a[i], b[j]));
                    }
                }
            }
        })
    };

    // Register double buffering: the next stage's global loads are issued before this
    // stage's products, so their latency hides behind the arithmetic.
    let fetch = |e: &mut Emitter, regs: &[String]| {
        let all = a_loads.iter().map(|l| (l, &a_ptr)).chain(b_loads.iter().map(|l| (l, &b_ptr)));
        for ((l, base), v) in all.zip(regs) {
            let k_ok = e.predicate("lt.s32", &l.k, &k.k.to_string());
            let ok = e.value(Reg::Pred, "and.pred", &format!("{k_ok}, {}", l.in_range));
            e.op(format!("mov.f32 {v}, {}", f32_imm(0.0)));
            let addr = e.element_address(base, &l.offset);
            e.op(format!("@{ok} ld.global.nc.f32 {v}, [{addr}]"));
        }
    };
    let staged: Vec<String> = (0..a_loads.len() + b_loads.len()).map(|_| e.reg(Reg::F32)).collect();
    fetch(&mut e, &staged);
    let stages = k.k.div_ceil(t.bk);
    let stage = e.value(Reg::B32, "mov.s32", "0");
    e.counted_loop(("stage", "stages_done"), &stage, stages, "1", |e| {
        for (l, v) in a_loads.iter().chain(&b_loads).zip(&staged) {
            e.op(format!("st.shared.f32 [{}], {v}", l.slot));
        }
        e.op("bar.sync 0");
        for (loads, step) in [(&a_loads, sk), (&b_loads, skb)] {
            for l in loads.iter() {
                e.op(format!("add.s32 {o}, {o}, {}", step * t.bk as i64, o = l.offset));
                e.op(format!("add.s32 {k}, {k}, {}", t.bk, k = l.k));
            }
        }
        // Past the last stage the k bounds fail and nothing is read.
        fetch(e, &staged);
        compute(e);
        e.op("bar.sync 0");
    });
    for Product { row: (row_base, dr), col: (col_base, dc), acc: c } in &products {
        let r = e.value(Reg::B32, "add.s32", &format!("{row_base}, {dr}"));
        let r = e.value(Reg::B32, "add.s32", &format!("{r}, {row0}"));
        let col = e.value(Reg::B32, "add.s32", &format!("{col_base}, {dc}"));
        let col = e.value(Reg::B32, "add.s32", &format!("{col}, {col0}"));
        let row_ok = e.predicate("lt.s32", &r, &k.m.to_string());
        let row_off = e.value(Reg::B32, "mad.lo.s32", &format!("{r}, {}, {out_base}", k.n));
        let col_ok = e.predicate("lt.s32", &col, &k.n.to_string());
        let ok = e.value(Reg::Pred, "and.pred", &format!("{row_ok}, {col_ok}"));
        let off = e.value(Reg::B32, "add.s32", &format!("{row_off}, {col}"));
        let value = if k.epilogue.is_empty() {
            c.clone()
        } else {
            // The epilogue on this product element; its inputs are read only in bounds.
            let mut leaf = |e: &mut Emitter, l: Leaf| match l {
                Leaf::Input(i) => {
                    let a = &epi_bases[i as usize];
                    let (sr, sc) = (a.1[0], a.1[1]);
                    let o = e.value(Reg::B32, "mad.lo.s32", &format!("{r}, {sr}, {}", a.0));
                    let o = e.value(Reg::B32, "mad.lo.s32", &format!("{col}, {sc}, {o}"));
                    let x = e.value(Reg::F32, "mov.f32", &f32_imm(0.0));
                    let addr = e.element_address(&epi_ptrs[i as usize], &o);
                    e.op(format!("@{ok} ld.global.nc.f32 {x}, [{addr}]"));
                    x
                }
                Leaf::Acc => c.clone(),
                // Linear index of the output element (iota / random nodes).
                Leaf::Index => off.clone(),
            };
            e.eval(&k.epilogue, k.epilogue.len() - 1, &mut vec![None; k.epilogue.len()], &mut leaf)
        };
        let addr = e.element_address(&out, &off);
        e.op(format!("@{ok} st.global.f32 [{addr}], {value}"));
    }
    let globals = format!(
        ".shared .align 16 .b8 gt_tile_a[{}];\n.shared .align 16 .b8 gt_tile_b[{}];\n\n",
        t.bk * lda * 4,
        t.bk * ldb * 4
    );
    let comment = format!(
        "matmul {}x{}x{} (batch {}), {}, tile {}x{}x{}, {}x{} per thread, epilogue of {} nodes",
        k.m,
        k.n,
        k.k,
        k.batch_count(),
        if t.tensor_cores { "TF32 tensor cores (mma.sync m16n8k8)" } else { "f32 FMA" },
        t.bm,
        t.bn,
        t.bk,
        t.tm,
        t.tn,
        k.epilogue.len()
    );
    let grid = (k.n.div_ceil(t.bn) as u32, k.m.div_ceil(t.bm) as u32, k.batch_count() as u32);
    if grid.1 > MAX_GRID_YZ || grid.2 > MAX_GRID_YZ {
        return Err(PtxError::Grid { what: format!("{} row tiles x {} matrices", grid.1, grid.2) });
    }
    Ok(PtxKernel {
        text: e.finish(&comment, &globals, 3 + k.epilogue_inputs.len()),
        grid,
        block: (threads as u32, 1, 1),
    })
}
