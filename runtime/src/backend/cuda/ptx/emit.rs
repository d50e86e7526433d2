//! The [`Emitter`]: virtual registers, labels and the instruction-text helpers every kernel
//! builds on (addresses, index decoding, loops, loads and stores converting between each
//! buffer's storage and what the kernel computes in), and the module's final text. The
//! arithmetic of one element is in `math.rs`.

use super::{ENTRY, PTX_TARGET, PTX_VERSION};
use foldhash::HashMap;
use gt_ir::kernel::{BufferStorage, Compute, Storage};
use std::fmt::Write;

/// An f32 immediate in PTX's exact hex form.
pub(super) fn f32_imm(x: f32) -> String {
    format!("0f{:08X}", x.to_bits())
}

pub(super) fn f64_imm(x: f64) -> String {
    format!("0d{:016X}", x.to_bits())
}

/// Builds a kernel body with fresh virtual registers; declarations are written at the end.
/// It knows each buffer's storage and what the kernel computes in ([`Compute`]), so loads
/// convert to it and stores convert back, as `.to(dtype)` does.
#[derive(Default)]
pub(super) struct Emitter {
    /// What values are computed in (`f32` unless the kernel says otherwise).
    compute: Compute,
    body: String,
    regs: [usize; 6],
    labels: usize,
    /// Storage of parameter `i`'s buffer (0 the output, then the inputs); `f32` past the end.
    params: Vec<Storage>,
    /// Storage of each buffer address register made by [`Emitter::param_pointer`].
    storage: HashMap<String, Storage>,
    /// Whether `%rs0` (a zero half, for widening bf16) is used.
    zero16: bool,
    /// Performance directives of the entry (`.maxntid`, `.minnctapersm`), if any.
    bounds: Option<(usize, usize)>,
    /// The PTX ISA version and target, when not [`PTX_VERSION`] and [`PTX_TARGET`] (kernels
    /// using instructions of one architecture only, as `wgmma` on `sm_90a`).
    header: Option<(&'static str, &'static str)>,
}

#[derive(Clone, Copy)]
pub(super) enum Reg {
    B32 = 0,
    B64 = 1,
    F32 = 2,
    F64 = 3,
    Pred = 4,
    B16 = 5,
}

const REG_PREFIX: [(&str, &str); 6] =
    [("%r", ".b32"), ("%rd", ".b64"), ("%f", ".f32"), ("%fd", ".f64"), ("%p", ".pred"), ("%rs", ".b16")];

impl Emitter {
    /// An emitter for a kernel whose buffers are stored as `storage` says.
    pub(super) fn new(storage: &BufferStorage) -> Emitter {
        let params = std::iter::once(storage.output).chain(storage.inputs.iter().copied()).collect();
        Emitter { params, ..Emitter::default() }
    }

    /// The storage of the buffer at address register `base`.
    pub(super) fn storage(&self, base: &str) -> Storage {
        self.storage.get(base).copied().unwrap_or_default()
    }

    /// Computes in `compute` from now on.
    pub(super) fn computing(&mut self, compute: Compute) {
        self.compute = compute;
    }

    /// What values are computed in.
    pub(super) fn compute(&self) -> Compute {
        self.compute
    }

    /// The register kind of a computed value.
    pub(super) fn num(&self) -> Reg {
        match self.compute {
            Compute::F32 => Reg::F32,
            Compute::F64 => Reg::F64,
            Compute::I64 => Reg::B64,
        }
    }

    /// The PTX type of a computed value (`f32`, `f64`, `s64`).
    pub(super) fn ty(&self) -> &'static str {
        match self.compute {
            Compute::F32 => "f32",
            Compute::F64 => "f64",
            Compute::I64 => "s64",
        }
    }

    /// `x` as an immediate of the compute type (converted as `.to(dtype)` converts it).
    pub(super) fn imm(&self, x: f64) -> String {
        match self.compute {
            Compute::F32 => f32_imm(x as f32),
            Compute::F64 => f64_imm(x),
            // i64::MIN in hex: its decimal would be read as the negation of a number past i64.
            Compute::I64 => match x as i64 {
                i64::MIN => "0x8000000000000000".to_string(),
                k => k.to_string(),
            },
        }
    }

    /// A fresh register of the compute type holding `x`.
    pub(super) fn constant(&mut self, x: f64) -> String {
        let (kind, mov, imm) = (self.num(), format!("mov.{}", self.ty()), self.imm(x));
        self.value(kind, &mov, &imm)
    }

    /// `dst = x` between registers of the compute type.
    pub(super) fn assign(&mut self, dst: &str, x: &str) {
        let ty = self.ty();
        self.op(format!("mov.{ty} {dst}, {x}"));
    }

    /// Whether the computed value `x` is nonzero (NaN counts, as `where` and a cast to
    /// `bool` count it).
    pub(super) fn nonzero(&mut self, x: &str) -> String {
        match self.compute {
            Compute::F32 => self.predicate("neu.f32", x, &f32_imm(0.0)),
            Compute::F64 => self.predicate("neu.f64", x, &f64_imm(0.0)),
            Compute::I64 => self.predicate("ne.s64", x, "0"),
        }
    }

    pub(super) fn reg(&mut self, kind: Reg) -> String {
        let n = &mut self.regs[kind as usize];
        *n += 1;
        format!("{}{}", REG_PREFIX[kind as usize].0, *n)
    }

    /// Tells ptxas the block size and how many blocks should fit an SM at once, so that it
    /// keeps registers to what that allows.
    pub(super) fn launch_bounds(&mut self, threads: usize, min_blocks: usize) {
        self.bounds = Some((threads, min_blocks));
    }

    /// Writes the module for `version` and `target` instead of the defaults.
    pub(super) fn target(&mut self, version: &'static str, target: &'static str) {
        self.header = Some((version, target));
    }

    pub(super) fn label(&mut self, what: &str) -> String {
        self.labels += 1;
        format!("$L_{what}_{}", self.labels)
    }

    pub(super) fn op(&mut self, line: impl AsRef<str>) {
        self.body.push('\t');
        self.body.push_str(line.as_ref());
        self.body.push_str(";\n");
    }

    pub(super) fn place(&mut self, label: &str) {
        let _ = writeln!(self.body, "{label}:");
    }

    /// `dst = op(args)` into a fresh register of `kind`.
    pub(super) fn value(&mut self, kind: Reg, instr: &str, args: &str) -> String {
        let d = self.reg(kind);
        self.op(format!("{instr} {d}, {args}"));
        d
    }

    /// The global address in parameter `name` (`gt_param_<i>`), with its buffer's storage.
    pub(super) fn param_pointer(&mut self, name: &str) -> String {
        let raw = self.value(Reg::B64, "ld.param.u64", &format!("[{name}]"));
        let ptr = self.value(Reg::B64, "cvta.to.global.u64", &raw);
        let index = name.strip_prefix("gt_param_").and_then(|i| i.parse::<usize>().ok());
        let storage = index.and_then(|i| self.params.get(i).copied()).unwrap_or_default();
        self.storage.insert(ptr.clone(), storage);
        ptr
    }

    /// `while var < bound { body; var += step }` over an initialised s32 register `var`, with
    /// labels named `top`/`end`. The bound test is unsigned, so a grid-stride index that passes
    /// 2^31 ends the loop instead of wrapping negative.
    pub(super) fn counted_loop(
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
    pub(super) fn buffers(&mut self, inputs: usize) -> (String, Vec<String>) {
        let out = self.param_pointer("gt_param_0");
        (out, (0..inputs).map(|i| self.param_pointer(&format!("gt_param_{}", i + 1))).collect())
    }

    pub(super) fn special(&mut self, name: &str) -> String {
        self.value(Reg::B32, "mov.u32", name)
    }

    /// The module: header, optional module-scope declarations, the entry with its
    /// parameters and register declarations.
    pub(super) fn finish(self, comment: &str, globals: &str, params: usize) -> String {
        let mut out = String::new();
        let _ = write!(out, "// gt generated kernel: {comment}");
        if self.params.iter().any(|&s| s != Storage::F32) {
            // Which buffers hold halves: the kernel IR itself does not say.
            let name = |s: &Storage| format!("{s:?}").to_lowercase();
            let inputs: Vec<String> = self.params.iter().skip(1).map(name).collect();
            let inputs = if inputs.is_empty() { "none".to_string() } else { inputs.join(" ") };
            let _ = write!(out, "; buffers: out {}, in {inputs}", name(&self.params[0]));
        }
        out.push('\n');
        let (version, target) = self.header.unwrap_or((PTX_VERSION, PTX_TARGET));
        let _ = writeln!(out, ".version {version}\n.target {target}\n.address_size 64\n");
        out.push_str(globals);
        let names: Vec<String> = (0..params).map(|i| format!("\t.param .u64 gt_param_{i}")).collect();
        let bounds = self
            .bounds
            .map(|(threads, blocks)| format!(".maxntid {threads}, 1, 1\n.minnctapersm {blocks}\n"))
            .unwrap_or_default();
        let _ = writeln!(out, ".visible .entry {ENTRY}(\n{}\n)\n{bounds}{{", names.join(",\n"));
        for (i, (prefix, ty)) in REG_PREFIX.iter().enumerate() {
            if self.regs[i] > 0 {
                let _ = writeln!(out, "\t.reg {ty} {prefix}<{}>;", self.regs[i] + 1);
            }
        }
        if self.zero16 {
            out.push_str("\tmov.b16 %rs0, 0;\n");
        }
        out.push_str(&self.body);
        out.push_str("\tret;\n}\n");
        out
    }

    /// `base + index * size`, the address of element `index` (s32) of the buffer at `base`.
    pub(super) fn element_address(&mut self, base: &str, index: &str) -> String {
        let size = self.storage(base).bytes();
        self.value(Reg::B64, "mad.wide.s32", &format!("{index}, {size}, {base}"))
    }

    /// Decodes `index` (s32) into coordinates over `dims` (row-major); `None` for axes of
    /// size 1 (coordinate 0).
    pub(super) fn coords(&mut self, index: &str, dims: &[usize]) -> Vec<Option<String>> {
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
    pub(super) fn dot(&mut self, offset: i64, coords: &[Option<String>], strides: &[i64]) -> String {
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

    /// `pred ? on_true : on_false` between values of the compute type.
    pub(super) fn select(&mut self, pred: &str, on_true: &str, on_false: &str) -> String {
        let (kind, selp) = (self.num(), format!("selp.{}", self.ty()));
        self.value(kind, &selp, &format!("{on_true}, {on_false}, {pred}"))
    }

    pub(super) fn predicate(&mut self, cmp: &str, a: &str, b: &str) -> String {
        self.value(Reg::Pred, &format!("setp.{cmp}"), &format!("{a}, {b}"))
    }

    /// Loads element `offset` (an s32 element index) of the read-only buffer at `base`,
    /// converted to the compute type.
    pub(super) fn load(&mut self, base: &str, offset: &str) -> String {
        self.load_if(None, base, offset)
    }

    /// [`Emitter::load`] when `guard` holds, else 0 (nothing is read).
    pub(super) fn load_if(&mut self, guard: Option<&str>, base: &str, offset: &str) -> String {
        let x = self.reg(self.num());
        self.load_into(&x, guard, base, offset);
        x
    }

    /// [`Emitter::load_if`] into the existing register `dst` (of the compute type).
    pub(super) fn load_into(&mut self, dst: &str, guard: Option<&str>, base: &str, offset: &str) {
        let addr = self.element_address(base, offset);
        let at = guard.map(|p| format!("@{p} ")).unwrap_or_default();
        let storage = self.storage(base);
        // The register the element is loaded into (its own type), zeroed first when guarded.
        let (kind, ld, zero) = match storage {
            Storage::F32 => (Reg::F32, "f32", f32_imm(0.0)),
            Storage::F16 | Storage::Bf16 => (Reg::B16, "b16", "0".to_string()),
            Storage::F64 => (Reg::F64, "f64", f64_imm(0.0)),
            Storage::I64 => (Reg::B64, "s64", "0".to_string()),
            Storage::I32 => (Reg::B32, "s32", "0".to_string()),
            Storage::Bool => (Reg::B32, "u8", "0".to_string()),
        };
        let same = matches!(
            (storage, self.compute),
            (Storage::F32, Compute::F32) | (Storage::F64, Compute::F64) | (Storage::I64, Compute::I64)
        );
        let raw = if same { dst.to_string() } else { self.reg(kind) };
        if guard.is_some() {
            let mov = if ld == "u8" { "u32" } else { ld };
            self.op(format!("mov.{mov} {raw}, {zero}"));
        }
        self.op(format!("{at}ld.global.nc.{ld} {raw}, [{addr}]"));
        if !same {
            self.unstored_into(dst, storage, &raw);
        }
    }

    /// `dst` (of the compute type) = `raw`, an element as `storage` holds it in a register
    /// (what a load of it gives: halves as b16, `bool` as a u32 0 or 1).
    fn unstored_into(&mut self, dst: &str, storage: Storage, raw: &str) {
        match storage {
            Storage::F16 | Storage::Bf16 => {
                if self.compute == Compute::F32 {
                    self.widen_into(dst, storage, raw);
                } else {
                    let f = self.reg(Reg::F32);
                    self.widen_into(&f, storage, raw);
                    self.convert_into(dst, "f32", &f);
                }
            }
            Storage::F32 => self.convert_into(dst, "f32", raw),
            Storage::F64 => self.convert_into(dst, "f64", raw),
            Storage::I64 => self.convert_into(dst, "s64", raw),
            Storage::I32 => self.convert_into(dst, "s32", raw),
            Storage::Bool => self.convert_into(dst, "u32", raw),
        }
    }

    /// `x` (of PTX type `from`, as [`Emitter::convert_into`] takes) in the compute type:
    /// `x` itself when it already is, else a fresh register.
    pub(super) fn converted(&mut self, from: &str, x: &str) -> String {
        if from == self.ty() {
            return x.to_string();
        }
        let dst = self.reg(self.num());
        self.convert_into(&dst, from, x);
        dst
    }

    /// `dst` (of the compute type) = `x` (of PTX type `from`: `f32`, `f64`, `s64`, `s32` or
    /// `u32`), converted as `.to(dtype)` converts: floats truncate into integers (saturating,
    /// NaN to 0, as PTX's `cvt` does), an `i64` becomes a float through `f64`.
    fn convert_into(&mut self, dst: &str, from: &str, x: &str) {
        let op = match (self.compute, from) {
            (Compute::F32, "f32") | (Compute::F64, "f64") | (Compute::I64, "s64") => {
                let ty = self.ty();
                return self.op(format!("mov.{ty} {dst}, {x}"));
            }
            (Compute::F32, "s64") => {
                let wide = self.value(Reg::F64, "cvt.rn.f64.s64", x);
                return self.op(format!("cvt.rn.f32.f64 {dst}, {wide}"));
            }
            (Compute::F32, _) => format!("cvt.rn.f32.{from}"),
            (Compute::F64, "f32") => "cvt.f64.f32".to_string(),
            (Compute::F64, _) => format!("cvt.rn.f64.{from}"),
            (Compute::I64, "f32" | "f64") => format!("cvt.rzi.s64.{from}"),
            (Compute::I64, "s32") => "cvt.s64.s32".to_string(),
            (Compute::I64, _) => format!("cvt.u64.{from}"),
        };
        self.op(format!("{op} {dst}, {x}"));
    }

    /// The computed value `x` as an `f64` (exact from `f32`; an `i64` rounds).
    fn as_f64(&mut self, x: &str) -> String {
        match self.compute {
            Compute::F32 => self.value(Reg::F64, "cvt.f64.f32", x),
            Compute::F64 => x.to_string(),
            Compute::I64 => self.value(Reg::F64, "cvt.rn.f64.s64", x),
        }
    }

    /// `width` (4 or 8) consecutive elements from `first` (a multiple of `width`), in
    /// 16-byte vector loads (8 halves are one `v4.b32`, unpacked).
    pub(super) fn load_vec(&mut self, base: &str, first: &str, width: usize) -> Vec<String> {
        let storage = self.storage(base);
        if width == 4 {
            return self.load4(base, first);
        }
        if storage == Storage::F32 {
            let second = self.value(Reg::B32, "add.s32", &format!("{first}, 4"));
            let mut regs = self.load4(base, first);
            regs.extend(self.load4(base, &second));
            return regs;
        }
        let addr = self.element_address(base, first);
        let words: Vec<String> = (0..4).map(|_| self.reg(Reg::B32)).collect();
        self.op(format!("ld.global.nc.v4.b32 {{{}}}, [{addr}]", words.join(", ")));
        let mut regs = Vec::new();
        for w in &words {
            let (lo, hi) = (self.reg(Reg::B16), self.reg(Reg::B16));
            self.op(format!("mov.b32 {{{lo}, {hi}}}, {w}"));
            for h in [lo, hi] {
                let r = self.reg(Reg::F32);
                self.widen_into(&r, storage, &h);
                regs.push(r);
            }
        }
        regs
    }

    /// Stores `values` (4 or 8) as consecutive elements from `first` (a multiple of their
    /// count), in 16-byte vector stores.
    pub(super) fn store_vec(&mut self, base: &str, first: &str, values: &[String]) {
        let storage = self.storage(base);
        if values.len() == 4 {
            return self.store4(base, first, values);
        }
        if storage == Storage::F32 {
            let second = self.value(Reg::B32, "add.s32", &format!("{first}, 4"));
            self.store4(base, first, &values[..4]);
            return self.store4(base, &second, &values[4..]);
        }
        let addr = self.element_address(base, first);
        let words: Vec<String> = values
            .chunks(2)
            .map(|pair| {
                let (lo, hi) = (self.narrow(storage, &pair[0]), self.narrow(storage, &pair[1]));
                self.value(Reg::B32, "mov.b32", &format!("{{{lo}, {hi}}}"))
            })
            .collect();
        self.op(format!("st.global.v4.b32 [{addr}], {{{}}}", words.join(", ")));
    }

    /// Four consecutive elements from `first` (a multiple of 4), in one vector load.
    pub(super) fn load4(&mut self, base: &str, first: &str) -> Vec<String> {
        let addr = self.element_address(base, first);
        let regs: Vec<String> = (0..4).map(|_| self.reg(Reg::F32)).collect();
        match self.storage(base) {
            Storage::F32 => self.op(format!("ld.global.nc.v4.f32 {{{}}}, [{addr}]", regs.join(", "))),
            half => {
                let hs: Vec<String> = (0..4).map(|_| self.reg(Reg::B16)).collect();
                self.op(format!("ld.global.nc.v4.b16 {{{}}}, [{addr}]", hs.join(", ")));
                for (r, h) in regs.iter().zip(&hs) {
                    self.widen_into(r, half, h);
                }
            }
        }
        regs
    }

    /// Stores the computed `value` as element `offset` of the buffer at `base`, converted to
    /// its storage, when `guard` holds.
    pub(super) fn store(&mut self, guard: Option<&str>, base: &str, offset: &str, value: &str) {
        let addr = self.element_address(base, offset);
        let at = guard.map(|p| format!("@{p} ")).unwrap_or_default();
        let (st, x) = self.stored(self.storage(base), value);
        self.op(format!("{at}st.global.{st} [{addr}], {x}"));
    }

    /// The computed `value` converted to `storage`, and the store's type.
    fn stored(&mut self, storage: Storage, value: &str) -> (&'static str, String) {
        let c = self.compute;
        match storage {
            Storage::F32 => match c {
                Compute::F32 => ("f32", value.to_string()),
                _ => {
                    let wide = self.as_f64(value);
                    ("f32", self.value(Reg::F32, "cvt.rn.f32.f64", &wide))
                }
            },
            Storage::F16 | Storage::Bf16 => match c {
                Compute::F32 => ("b16", self.narrow(storage, value)),
                _ => {
                    let wide = self.as_f64(value);
                    ("b16", self.narrow_f64(storage, &wide))
                }
            },
            Storage::F64 => ("f64", self.as_f64(value)),
            Storage::I64 | Storage::I32 => {
                let whole = match c {
                    Compute::F32 => self.value(Reg::B64, "cvt.rzi.s64.f32", value),
                    Compute::F64 => self.value(Reg::B64, "cvt.rzi.s64.f64", value),
                    Compute::I64 => value.to_string(),
                };
                if storage == Storage::I64 {
                    ("b64", whole)
                } else {
                    // Through i64, so that an integer wraps (its low 32 bits).
                    ("b32", self.value(Reg::B32, "cvt.u32.u64", &whole))
                }
            }
            Storage::Bool => {
                let p = self.nonzero(value);
                ("u8", self.value(Reg::B32, "selp.u32", &format!("1, 0, {p}")))
            }
        }
    }

    /// The computed `x` converted to `storage` and back (a store and a load, in registers).
    pub(super) fn round_through(&mut self, storage: Storage, x: &str) -> String {
        let (_, raw) = self.stored(storage, x);
        let dst = self.reg(self.num());
        self.unstored_into(&dst, storage, &raw);
        dst
    }

    /// The `f64` register `x` as a `half`, in a b16 register: rounded to `f32` first, then
    /// to the nearest half (ties to even), as PyTorch and the interpreter convert a double
    /// (`gt_ir::data::f16_of`).
    fn narrow_f64(&mut self, half: Storage, x: &str) -> String {
        let f = self.value(Reg::F32, "cvt.rn.f32.f64", x);
        self.narrow(half, &f)
    }

    /// Stores four `f32` registers as elements `first..first + 4` (`first` a multiple of 4).
    pub(super) fn store4(&mut self, base: &str, first: &str, values: &[String]) {
        let addr = self.element_address(base, first);
        match self.storage(base) {
            Storage::F32 => self.op(format!("st.global.v4.f32 [{addr}], {{{}}}", values.join(", "))),
            half => {
                let hs: Vec<String> = values.iter().map(|v| self.narrow(half, v)).collect();
                self.op(format!("st.global.v4.b16 [{addr}], {{{}}}", hs.join(", ")));
            }
        }
    }

    /// `dst = h as f32` for a half `h` stored as `half`.
    fn widen_into(&mut self, dst: &str, half: Storage, h: &str) {
        match half {
            Storage::F16 => self.op(format!("cvt.f32.f16 {dst}, {h}")),
            // A bfloat16 is the top half of the f32 with the same bits (PTX 7.0 has no cvt
            // from bf16).
            _ => {
                self.zero16 = true;
                self.op(format!("mov.b32 {dst}, {{%rs0, {h}}}"));
            }
        }
    }

    /// `x` rounded to the nearest `half` (ties to even), in a b16 register.
    pub(super) fn narrow(&mut self, half: Storage, x: &str) -> String {
        let ty = if half == Storage::F16 { "f16" } else { "bf16" };
        self.value(Reg::B16, &format!("cvt.rn.{ty}.f32"), x)
    }

    /// This thread's global index (s32) and the grid's stride.
    pub(super) fn global_thread(&mut self) -> (String, String) {
        let (ctaid, ntid, tid) = (self.special("%ctaid.x"), self.special("%ntid.x"), self.special("%tid.x"));
        let index = self.value(Reg::B32, "mad.lo.s32", &format!("{ctaid}, {ntid}, {tid}"));
        let nctaid = self.special("%nctaid.x");
        let stride = self.value(Reg::B32, "mul.lo.s32", &format!("{nctaid}, {ntid}"));
        (index, stride)
    }
}
