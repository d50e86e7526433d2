//! The [`Emitter`]: virtual registers, labels and the instruction-text helpers every kernel
//! builds on (addresses, index decoding, loops), and the module's final text. The arithmetic
//! of one element is in `math.rs`.

use super::{ENTRY, PTX_TARGET, PTX_VERSION};
use std::fmt::Write;

/// An f32 immediate in PTX's exact hex form.
pub(super) fn f32_imm(x: f32) -> String {
    format!("0f{:08X}", x.to_bits())
}

pub(super) fn f64_imm(x: f64) -> String {
    format!("0d{:016X}", x.to_bits())
}

/// Builds a kernel body with fresh virtual registers; declarations are written at the end.
#[derive(Default)]
pub(super) struct Emitter {
    body: String,
    regs: [usize; 5],
    labels: usize,
}

#[derive(Clone, Copy)]
pub(super) enum Reg {
    B32 = 0,
    B64 = 1,
    F32 = 2,
    F64 = 3,
    Pred = 4,
}

const REG_PREFIX: [(&str, &str); 5] =
    [("%r", ".b32"), ("%rd", ".b64"), ("%f", ".f32"), ("%fd", ".f64"), ("%p", ".pred")];

impl Emitter {
    pub(super) fn reg(&mut self, kind: Reg) -> String {
        let n = &mut self.regs[kind as usize];
        *n += 1;
        format!("{}{}", REG_PREFIX[kind as usize].0, *n)
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

    pub(super) fn param_pointer(&mut self, name: &str) -> String {
        let raw = self.value(Reg::B64, "ld.param.u64", &format!("[{name}]"));
        self.value(Reg::B64, "cvta.to.global.u64", &raw)
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
    pub(super) fn element_address(&mut self, base: &str, index: &str) -> String {
        self.value(Reg::B64, "mad.wide.s32", &format!("{index}, 4, {base}"))
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

    pub(super) fn select(&mut self, pred: &str, on_true: &str, on_false: &str) -> String {
        self.value(Reg::F32, "selp.f32", &format!("{on_true}, {on_false}, {pred}"))
    }

    pub(super) fn predicate(&mut self, cmp: &str, a: &str, b: &str) -> String {
        self.value(Reg::Pred, &format!("setp.{cmp}"), &format!("{a}, {b}"))
    }

    /// Loads input `i` of element `offset` (an s32 element index).
    pub(super) fn load(&mut self, base: &str, offset: &str) -> String {
        let addr = self.element_address(base, offset);
        self.value(Reg::F32, "ld.global.nc.f32", &format!("[{addr}]"))
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
