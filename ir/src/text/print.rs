//! The `.gtir` printer: programs and single instructions to text that parses back to
//! the same thing. Floats print in Rust's shortest round-trip form.

use crate::data::Elements;
use crate::{
    CollectiveOp, Comparison, Instr, Number, Operand, Optimizer, Placement, Program, SliceItem, SplitSpec, Stmt,
    StmtKind, TensorType, Train, Types, ValueId,
};
use std::fmt::Write;

/// Prints a program.
pub fn print(program: &Program) -> String {
    Printer { program, types: None, out: String::new() }.run()
}

/// Prints a program with each result's inferred type as a trailing comment.
pub fn print_with_types(program: &Program, types: &Types) -> String {
    Printer { program, types: Some(types), out: String::new() }.run()
}

/// Prints one instruction of a stream, naming values `%N`.
pub fn print_instr(instr: &Instr) -> String {
    let mut s = String::new();
    write_instr(&mut s, instr, &|v: ValueId| v.0.to_string());
    s
}

struct Printer<'a> {
    program: &'a Program,
    types: Option<&'a Types>,
    out: String,
}

impl Printer<'_> {
    fn run(mut self) -> String {
        let body = &self.program.body;
        self.block(body, 0);
        self.out
    }

    fn block(&mut self, body: &[Stmt], depth: usize) {
        for stmt in body {
            self.stmt(stmt, depth);
        }
    }

    fn stmt(&mut self, stmt: &Stmt, depth: usize) {
        let indent = "  ".repeat(depth);
        let p = self.program;
        let name = |v: ValueId| p.name(v);
        let mut line = indent.clone();
        match &stmt.kind {
            StmtKind::Const { name, value } => {
                let _ = write!(line, "const {name} = {}", fmt_number(*value));
            }
            StmtKind::Instr(instr) => {
                write_instr(&mut line, instr, &name);
                if let Some(types) = self.types {
                    let tys: Vec<String> =
                        instr.results().iter().filter_map(|v| types.get(*v)).map(TensorType::to_string).collect();
                    if !tys.is_empty() {
                        let _ = write!(line, "  ; {}", tys.join(", "));
                    }
                }
            }
            StmtKind::Print { src } => {
                let _ = write!(line, "print %{}", name(*src));
            }
            StmtKind::Expect { src, cmp, ty, data } => {
                let op = match cmp {
                    Comparison::Exact => "==",
                    Comparison::Close { .. } => "~=",
                };
                let _ = write!(line, "expect %{} {op} ", name(*src));
                if let Some(t) = ty {
                    let _ = write!(line, "{t} ");
                }
                write_elements(&mut line, data);
                if let Comparison::Close { tol } = cmp {
                    let _ = write!(line, " tol={}", fmt_float(*tol));
                }
            }
            StmtKind::Repeat { count, body } => {
                let _ = writeln!(self.out, "{indent}repeat {count} {{");
                self.block(body, depth + 1);
                let _ = writeln!(self.out, "{indent}}}");
                return;
            }
            StmtKind::Train(t) => {
                let list = |vs: &[ValueId]| vs.iter().map(|v| format!("%{}", name(*v))).collect::<Vec<_>>().join(", ");
                let _ = match t {
                    Train::RequiresGrad { values } | Train::ZeroGrad { values } => {
                        write!(line, "{} {}", t.keyword(), list(values))
                    }
                    Train::Backward { loss } => write!(line, "backward %{}", name(*loss)),
                    Train::Grad { dst, of } => write!(line, "%{} = grad %{}", name(*dst), name(*of)),
                    Train::Step { optimizer, params } => {
                        let _ = write!(line, "{} {}", t.keyword(), list(params));
                        match optimizer {
                            Optimizer::Sgd { lr, momentum, weight_decay } => write!(
                                line,
                                " lr={} momentum={} weight_decay={}",
                                fmt_float(*lr),
                                fmt_float(*momentum),
                                fmt_float(*weight_decay)
                            ),
                            Optimizer::Adam { lr, beta1, beta2, eps } => write!(
                                line,
                                " lr={} beta1={} beta2={} eps={}",
                                fmt_float(*lr),
                                fmt_float(*beta1),
                                fmt_float(*beta2),
                                fmt_float(*eps)
                            ),
                        }
                    }
                };
            }
            StmtKind::Signal { name, body } => {
                let _ = writeln!(self.out, "{indent}signal {} {{", quote(name));
                self.block(body, depth + 1);
                let _ = writeln!(self.out, "{indent}}}");
                return;
            }
        }
        self.out.push_str(&line);
        self.out.push('\n');
    }
}

fn quote(s: &str) -> String {
    let mut q = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// Formats a float so that it parses back to the same value (shortest round-trip form of
/// its own precision, so an `f32` prints as `0.1`, not as its `f64` expansion).
pub fn fmt_float<T: Copy + Into<f64> + std::fmt::Debug>(x: T) -> String {
    let v: f64 = x.into();
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x:?}")
    }
}

fn fmt_number(n: Number) -> String {
    match n {
        Number::Int(i) => i.to_string(),
        Number::Float(f) => fmt_float(f),
    }
}

/// Tensor data as `.gtir` writes it: floats in their shortest round-tripping form, integers
/// and `true`/`false` as themselves.
fn write_elements(out: &mut String, data: &Elements) {
    fn list<T: Copy>(out: &mut String, v: &[T], f: impl Fn(T) -> String) {
        out.push('[');
        for (i, &x) in v.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(&f(x));
        }
        out.push(']');
    }
    match data {
        Elements::F64(v) => list(out, v, fmt_float),
        Elements::F32(v) => list(out, v, fmt_float),
        Elements::F16(v) => list(out, v, |x| fmt_float(x.to_f32())),
        Elements::BF16(v) => list(out, v, |x| fmt_float(x.to_f32())),
        Elements::I64(v) => list(out, v, |x| x.to_string()),
        Elements::I32(v) => list(out, v, |x| x.to_string()),
        Elements::Bool(v) => list(out, v, |x| x.to_string()),
    }
}

fn write_list<T: std::fmt::Display>(out: &mut String, items: &[T]) {
    out.push('[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{x}");
    }
    out.push(']');
}

fn operand(o: Operand, name: &dyn Fn(ValueId) -> String) -> String {
    match o {
        Operand::Value(v) => format!("%{}", name(v)),
        Operand::Scalar(x) => fmt_float(x),
    }
}

fn write_instr(out: &mut String, instr: &Instr, name: &dyn Fn(ValueId) -> String) {
    let v = |id: ValueId| format!("%{}", name(id));
    let results = instr.results();
    if !results.is_empty() {
        let names: Vec<String> = results.iter().map(|r| v(*r)).collect();
        let _ = write!(out, "{} = ", names.join(", "));
    }
    let m = instr.mnemonic();
    let _ = match instr {
        Instr::Randn { ty, seed, .. } | Instr::Rand { ty, seed, .. } => write!(out, "{m} {ty} seed={seed}"),
        Instr::Zeros { ty, .. } | Instr::Ones { ty, .. } => write!(out, "{m} {ty}"),
        Instr::Full { ty, value, .. } => write!(out, "{m} {ty} {}", fmt_float(*value)),
        Instr::Arange { dtype, start, end, step, .. } => {
            write!(out, "{m} {dtype} start={} end={} step={}", fmt_float(*start), fmt_float(*end), fmt_float(*step))
        }
        Instr::Literal { ty, data, .. } => {
            let _ = write!(out, "{m} {ty} ");
            write_elements(out, data);
            Ok(())
        }
        Instr::Unary { src, .. } => write!(out, "{m} {}", v(*src)),
        Instr::Cast { src, dtype, .. } => write!(out, "{m} {} {dtype}", v(*src)),
        Instr::Binary { lhs, rhs, .. } => write!(out, "{m} {}, {}", operand(*lhs, name), operand(*rhs, name)),
        Instr::Where { cond, on_true, on_false, .. } => {
            write!(out, "{m} {}, {}, {}", v(*cond), operand(*on_true, name), operand(*on_false, name))
        }
        Instr::MatMul { lhs, rhs, .. } => write!(out, "{m} {}, {}", v(*lhs), v(*rhs)),
        Instr::Reduce { src, axes, keepdim, .. } => {
            let _ = write!(out, "{m} {}", v(*src));
            if let Some(a) = axes {
                out.push_str(" axes=");
                write_list(out, a);
            }
            if *keepdim {
                out.push_str(" keepdim");
            }
            Ok(())
        }
        Instr::Transpose { src, dim0, dim1, .. } => write!(out, "{m} {} dim0={dim0} dim1={dim1}", v(*src)),
        Instr::Permute { src, perm, .. } => {
            let _ = write!(out, "{m} {} perm=", v(*src));
            write_list(out, perm);
            Ok(())
        }
        Instr::Reshape { src, shape, .. } => {
            let _ = write!(out, "{m} {} shape=", v(*src));
            write_list(out, shape);
            Ok(())
        }
        Instr::Squeeze { src, axes, .. } => {
            let _ = write!(out, "{m} {}", v(*src));
            if let Some(a) = axes {
                out.push_str(" axes=");
                write_list(out, a);
            }
            Ok(())
        }
        Instr::Unsqueeze { src, axis, .. } => write!(out, "{m} {} axis={axis}", v(*src)),
        Instr::BroadcastTo { src, shape, .. } => {
            let _ = write!(out, "{m} {} shape=", v(*src));
            write_list(out, shape);
            Ok(())
        }
        Instr::Concat { srcs, axis, .. } => {
            let names: Vec<String> = srcs.iter().map(|s| v(*s)).collect();
            write!(out, "{m} {} axis={axis}", names.join(", "))
        }
        Instr::Slice { src, index, .. } => {
            let items: Vec<String> = index.iter().map(slice_item).collect();
            write!(out, "{m} {} [{}]", v(*src), items.join(", "))
        }
        Instr::Split { src, axis, spec, .. } => {
            let _ = write!(out, "{m} {}", v(*src));
            let _ = match spec {
                SplitSpec::Size(n) => write!(out, " size={n}"),
                SplitSpec::Chunks(n) => write!(out, " chunks={n}"),
                SplitSpec::Sizes(s) => {
                    out.push_str(" sizes=");
                    write_list(out, s);
                    Ok(())
                }
            };
            write!(out, " axis={axis}")
        }
        Instr::Fused { ty, srcs, kernel, .. } => {
            let names: Vec<String> = srcs.iter().map(|s| v(*s)).collect();
            let sep = if names.is_empty() { "" } else { " " };
            write!(out, "{m}{sep}{} : {ty} {kernel}", names.join(", "))
        }
        Instr::Collective { op, srcs, .. } => {
            let names: Vec<String> = srcs.iter().map(|s| v(*s)).collect();
            let _ = match op {
                CollectiveOp::AllReduce(r) | CollectiveOp::ReduceScatter { op: r, .. } => {
                    write!(out, "{m} {} {}", r.mnemonic(), names.join(", "))
                }
                _ => write!(out, "{m} {}", names.join(", ")),
            };
            match op {
                CollectiveOp::AllGather { axis } | CollectiveOp::ReduceScatter { axis, .. } => {
                    write!(out, " axis={axis}")
                }
                _ => Ok(()),
            }
        }
        Instr::Free { src } | Instr::GetData { src } => write!(out, "{m} {}", v(*src)),
        Instr::HotPathStart { id } | Instr::HotPathEnd { id } => write!(out, "{m} {id}"),
        Instr::SignalStart { name, compile, backward, place } => {
            let _ = write!(
                out,
                "{m} {}{}{}",
                quote(name),
                if *backward { " backward" } else { "" },
                if *compile { " compile" } else { "" }
            );
            let workers = |out: &mut String, w: &[u32]| {
                if !w.is_empty() {
                    out.push_str(" workers=");
                    write_list(out, w);
                }
            };
            match place {
                Some(Placement::Split { axis, workers: w }) => {
                    let _ = write!(out, " shard axis={axis}");
                    workers(out, w);
                }
                Some(Placement::Replicated { workers: w }) => {
                    out.push_str(" replicated");
                    workers(out, w);
                }
                None => {}
            }
            Ok(())
        }
        Instr::SignalEnd { name } => write!(out, "{m} {}", quote(name)),
    };
}

fn slice_item(item: &SliceItem) -> String {
    match item {
        SliceItem::Index(i) => i.to_string(),
        SliceItem::NewAxis => "new".into(),
        SliceItem::Ellipsis => "...".into(),
        SliceItem::Range { start, end, step } => {
            let s = start.map(|x| x.to_string()).unwrap_or_default();
            let e = end.map(|x| x.to_string()).unwrap_or_default();
            if *step == 1 {
                format!("{s}:{e}")
            } else {
                format!("{s}:{e}:{step}")
            }
        }
    }
}
