//! The `.gtir` script runner: walks a verified [`Program`], sends its instructions to an
//! [`Executor`], prints what `print` asks for and checks `expect`s. Errors carry the
//! statement's span so that they name the script line.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use gt_ir::data::Elements;
use gt_ir::text::print::fmt_float;
use gt_ir::{Comparison, Executor, HostTensor, Instr, Program, Span, Stmt, StmtKind, TensorType, ValueId};
use std::io::Write;
use thiserror::Error;

/// How to run a script.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Do not print values (`print` still syncs, and expectations are still checked).
    pub quiet: bool,
    /// Never free values (by default each value is freed after its last use, as a program
    /// drops a tensor it no longer holds, so loops run in constant memory and the fuse
    /// pass knows which values die).
    pub keep_values: bool,
}

/// What a successful run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Instructions sent to the executor (loop bodies count once per iteration).
    pub instructions: u64,
    /// Expectations checked and met.
    pub expectations: u64,
}

/// A failure while running a script, at a statement.
#[derive(Debug, Error)]
#[error("{kind}")]
pub struct ScriptError {
    /// The statement (for a failure reported late, the failing instruction's).
    pub span: Span,
    /// Where a failure of an earlier instruction was reported (the sync point waiting).
    pub reported_at: Option<Span>,
    /// What failed.
    pub kind: ScriptErrorKind,
}

/// What failed.
#[derive(Debug, Error)]
pub enum ScriptErrorKind {
    /// The executor rejected or failed an instruction or a read.
    #[error("`{op}` failed: {source}")]
    Exec {
        /// The statement's op or keyword.
        op: &'static str,
        /// The executor's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A value whose type differs from the one `expect` names.
    #[error("expect %{name}: value has type {found}, expected {expected}")]
    ExpectType {
        /// The value.
        name: String,
        /// Type given.
        expected: Box<TensorType>,
        /// Type found.
        found: Box<TensorType>,
    },
    /// A value with another number of elements than `expect` gives values.
    #[error("expect %{name}: value has type {found}, expected {expected} values")]
    ExpectCount {
        /// The value.
        name: String,
        /// Values given.
        expected: usize,
        /// Type found.
        found: Box<TensorType>,
    },
    /// Values that differ from the expectation.
    #[error("expect %{name} {cmp} failed: {mismatches} of {total} elements differ; first at index {index:?}: found {}, expected {}{tol}", .values.0, .values.1)]
    ExpectValues {
        /// The value.
        name: String,
        /// `==` or `~=`.
        cmp: &'static str,
        /// Elements that differ.
        mismatches: usize,
        /// Elements compared.
        total: usize,
        /// Multi-dimensional index of the first difference.
        index: Box<[usize]>,
        /// The value found there and the one expected (converted to the value's dtype), in
        /// full precision.
        values: Box<(String, String)>,
        /// ` (tol 1e-5)` or empty.
        tol: Box<str>,
    },
    /// A training statement on an executor without autograd.
    #[error("`{keyword}` needs autograd: run the script through gt_frontend::tensor::TensorExecutor (gt-run does)")]
    NoAutograd {
        /// The statement's keyword.
        keyword: &'static str,
    },
    /// Writing the output failed.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// Runs a program (which should have passed [`gt_ir::verify`]) on an executor.
pub fn run_script<E: Executor>(
    program: &Program,
    exec: &mut E,
    out: &mut dyn Write,
    options: RunOptions,
) -> Result<RunSummary, ScriptError> {
    let frees = if options.keep_values { HashMap::new() } else { free_plan(program) };
    let mut runner = Runner { program, exec, out, options, summary: RunSummary::default(), frees };
    runner.block(&program.body)?;
    // An asynchronous executor may still owe the outcome of the last instructions.
    let end = program.body.last().map_or(Span::default(), |s| s.span);
    runner.exec.sync().map_err(|e| ScriptError { reported_at: None, ..Runner::<E>::fail(end, "sync")(e) })?;
    Ok(runner.summary)
}

struct Runner<'a, E> {
    program: &'a Program,
    exec: &'a mut E,
    out: &'a mut dyn Write,
    options: RunOptions,
    summary: RunSummary,
    /// Values to free after each statement (by the statement's address).
    frees: HashMap<*const Stmt, Vec<ValueId>>,
}

impl<E: Executor> Runner<'_, E> {
    fn block(&mut self, body: &[Stmt]) -> Result<(), ScriptError> {
        for stmt in body {
            self.stmt(stmt)?;
            if let Some(dead) = self.frees.get(&(stmt as *const Stmt)) {
                for &src in dead {
                    let free = Instr::Free { src };
                    self.exec.execute_at(&free, Some(stmt.span)).map_err(Self::fail(stmt.span, "free"))?;
                }
            }
        }
        Ok(())
    }

    fn fail(span: Span, op: &'static str) -> impl FnOnce(E::Error) -> ScriptError {
        move |e| match E::error_span(&e) {
            Some((at, failed_op)) => ScriptError {
                span: at,
                reported_at: (at != span).then_some(span),
                kind: ScriptErrorKind::Exec { op: failed_op, source: Box::new(e) },
            },
            _ => ScriptError { span, reported_at: None, kind: ScriptErrorKind::Exec { op, source: Box::new(e) } },
        }
    }

    fn read(&mut self, v: ValueId, span: Span, op: &'static str) -> Result<HostTensor, ScriptError> {
        self.exec.read(v).map_err(Self::fail(span, op))
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<(), ScriptError> {
        let span = stmt.span;
        let err = |kind| ScriptError { span, reported_at: None, kind };
        match &stmt.kind {
            StmtKind::Const { .. } => {}
            StmtKind::Instr(instr) => {
                // A written `signal_start` takes the config's directives, as a `signal` block.
                let marked;
                let instr = match instr {
                    Instr::SignalStart { name, compile, backward, place } => {
                        marked = crate::signal::start_marker(name, *compile, *backward, place.as_ref());
                        &marked
                    }
                    i => i,
                };
                self.exec.execute_at(instr, Some(span)).map_err(Self::fail(span, instr.mnemonic()))?;
                self.summary.instructions += 1;
            }
            StmtKind::Print { src } => {
                let t = self.read(*src, span, "print")?;
                if !self.options.quiet {
                    writeln!(self.out, "%{} = {t}", self.program.name(*src)).map_err(|e| err(e.into()))?;
                }
            }
            StmtKind::Expect { src, cmp, ty, data } => {
                let t = self.read(*src, span, "expect")?;
                let name = self.program.name(*src);
                if let Some(expected) = ty {
                    if *expected != t.ty {
                        return Err(err(ScriptErrorKind::ExpectType {
                            name,
                            expected: Box::new(expected.clone()),
                            found: Box::new(t.ty),
                        }));
                    }
                }
                check_values(&name, *cmp, &t, data).map_err(err)?;
                self.summary.expectations += 1;
            }
            StmtKind::Repeat { count, body } => {
                for _ in 0..*count {
                    self.block(body)?;
                }
            }
            StmtKind::Signal { name, body } => {
                let start = crate::signal::start_marker(name, false, false, None);
                self.exec.execute_at(&start, Some(span)).map_err(Self::fail(span, "signal"))?;
                self.block(body)?;
                let end = Instr::SignalEnd { name: name.clone() };
                self.exec.execute_at(&end, Some(span)).map_err(Self::fail(span, "signal"))?;
            }
            StmtKind::Train(t) => match self.exec.train(t, stmt as *const Stmt as usize, Some(span)) {
                Some(r) => r.map_err(Self::fail(span, t.keyword()))?,
                None => return Err(err(ScriptErrorKind::NoAutograd { keyword: t.keyword() })),
            },
        }
        Ok(())
    }
}

/// Which values to free after which statement: each value after the last statement of its
/// block that mentions it, unless a later statement of an enclosing block still needs it.
/// In a `repeat` body only values the body defines before reading them (not carried from
/// one iteration to the next) are freed inside it; the others are freed after the loop.
/// Values the script frees itself are left alone.
fn free_plan(program: &Program) -> HashMap<*const Stmt, Vec<ValueId>> {
    let mut explicit = HashSet::new();
    for (instr, _) in program.instrs() {
        if let Instr::Free { src } = instr {
            explicit.insert(*src);
        }
    }
    let mut plan = HashMap::new();
    plan_block(&program.body, &HashSet::new(), false, &explicit, &mut plan);
    plan
}

/// Plans `body`; returns the values it frees. `needed_after`: values read after the block.
fn plan_block(
    body: &[Stmt],
    needed_after: &HashSet<ValueId>,
    is_loop: bool,
    explicit: &HashSet<ValueId>,
    plan: &mut HashMap<*const Stmt, Vec<ValueId>>,
) -> HashSet<ValueId> {
    // What each statement reads and defines (blocks: everything inside).
    let facts: Vec<(Vec<ValueId>, Vec<ValueId>)> = body.iter().map(mentions).collect();
    let mut freed_inside = HashSet::new();
    // Nested blocks first: they free what dies inside them.
    for (i, stmt) in body.iter().enumerate() {
        if let StmtKind::Repeat { body: inner, .. } | StmtKind::Signal { body: inner, .. } = &stmt.kind {
            let mut after: HashSet<ValueId> = needed_after.clone();
            for (reads, defs) in &facts[i + 1..] {
                after.extend(reads.iter().chain(defs));
            }
            // A loop body running again reads what the body reads.
            if is_loop {
                for (reads, _) in &facts {
                    after.extend(reads);
                }
            }
            let looping = is_loop || matches!(stmt.kind, StmtKind::Repeat { .. });
            freed_inside.extend(plan_block(inner, &after, looping, explicit, plan));
        }
    }
    let mut last: HashMap<ValueId, usize> = HashMap::new();
    let mut first_is_def: HashMap<ValueId, bool> = HashMap::new();
    for (i, (reads, defs)) in facts.iter().enumerate() {
        for &v in reads {
            last.insert(v, i);
            first_is_def.entry(v).or_insert(false);
        }
        for &v in defs {
            last.insert(v, i);
            first_is_def.entry(v).or_insert(true);
        }
    }
    let mut freed = freed_inside.clone();
    let mut order: Vec<(usize, ValueId)> = last.into_iter().map(|(v, i)| (i, v)).collect();
    order.sort_unstable();
    for (i, v) in order {
        let defined_here = first_is_def.get(&v) == Some(&true);
        if !defined_here || needed_after.contains(&v) || explicit.contains(&v) || freed_inside.contains(&v) {
            continue;
        }
        // In a loop, a value read at the top of the next iteration is carried: keep it.
        plan.entry(&body[i] as *const Stmt).or_default().push(v);
        freed.insert(v);
    }
    freed
}

/// The values a statement reads and defines (for a block, every one inside it).
fn mentions(stmt: &Stmt) -> (Vec<ValueId>, Vec<ValueId>) {
    match &stmt.kind {
        StmtKind::Instr(i) => (i.operands().into_vec(), i.results().into_vec()),
        StmtKind::Print { src } | StmtKind::Expect { src, .. } => (vec![*src], vec![]),
        StmtKind::Const { .. } => (vec![], vec![]),
        StmtKind::Train(t) => (t.operands(), t.result().into_iter().collect()),
        StmtKind::Repeat { body, .. } | StmtKind::Signal { body, .. } => {
            let (mut reads, mut defs) = (Vec::new(), Vec::new());
            let mut defined = HashSet::new();
            for s in body {
                let (r, d) = mentions(s);
                // A read of a value the block defined earlier is internal to it.
                reads.extend(r.into_iter().filter(|v| !defined.contains(v)));
                defined.extend(d.iter().copied());
                defs.extend(d);
            }
            (reads, defs)
        }
    }
}

/// A number in full precision, as short as round-trips, without a trailing `.0`.
fn number<T: Copy + Into<f64> + std::fmt::Debug>(x: T) -> String {
    let s = fmt_float(x);
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

/// Whether `found` meets `expected` under a comparison (both of the value's dtype, as
/// `f64`s).
pub fn values_match(cmp: Comparison, found: f64, expected: f64) -> bool {
    if found.is_nan() || expected.is_nan() {
        return found.is_nan() && expected.is_nan();
    }
    match cmp {
        Comparison::Exact => found == expected,
        Comparison::Close { tol } => found == expected || (found - expected).abs() <= tol * expected.abs().max(1.0),
    }
}

/// Element `i` in full precision (as short as round-trips in its dtype).
fn element_text(data: &Elements, i: usize) -> String {
    match data {
        Elements::F32(v) => number(v[i]),
        Elements::F16(v) => number(v[i].to_f32()),
        Elements::BF16(v) => number(v[i].to_f32()),
        Elements::F64(v) => number(v[i]),
        Elements::I64(v) => v[i].to_string(),
        Elements::I32(v) => v[i].to_string(),
        Elements::Bool(v) => v[i].to_string(),
    }
}

fn check_values(name: &str, cmp: Comparison, t: &HostTensor, expected: &Elements) -> Result<(), ScriptErrorKind> {
    let (op, tol) = match cmp {
        Comparison::Exact => ("==", Box::from("")),
        Comparison::Close { tol } => ("~=", format!(" (tol {})", number(tol)).into_boxed_str()),
    };
    if t.data.len() != expected.len() {
        return Err(ScriptErrorKind::ExpectCount {
            name: name.to_string(),
            expected: expected.len(),
            found: Box::new(t.ty.clone()),
        });
    }
    // The expected values in the value's dtype: `expect %x == [0.1]` means the f32 nearest 0.1.
    let expected = expected.cast(t.ty.dtype);
    let bad: Vec<usize> = match (t.data.to_i64(), expected.to_i64()) {
        // Integers compare exactly: through `f64`, 2^53 + 1 would equal 2^53.
        (Some(found), Some(wanted)) => (0..wanted.len())
            .filter(|&i| match cmp {
                Comparison::Exact => found[i] != wanted[i],
                Comparison::Close { tol } => {
                    let gap = (i128::from(found[i]) - i128::from(wanted[i])).unsigned_abs() as f64;
                    gap > tol * (wanted[i] as f64).abs().max(1.0)
                }
            })
            .collect(),
        _ => {
            let (found, wanted) = (t.data.to_f64(), expected.to_f64());
            (0..wanted.len()).filter(|&i| !values_match(cmp, found[i], wanted[i])).collect()
        }
    };
    let Some(&first) = bad.first() else { return Ok(()) };
    Err(ScriptErrorKind::ExpectValues {
        name: name.to_string(),
        cmp: op,
        mismatches: bad.len(),
        total: expected.len(),
        index: unravel(first, t.ty.shape.dims()).into_boxed_slice(),
        values: Box::new((element_text(&t.data, first), element_text(&expected, first))),
        tol,
    })
}

/// The multi-dimensional index of a row-major offset.
fn unravel(mut offset: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for (i, &d) in dims.iter().enumerate().rev() {
        if d > 0 {
            index[i] = offset % d;
            offset /= d;
        }
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_comparison_is_relative_above_one() {
        let c = Comparison::Close { tol: 1e-3 };
        assert!(values_match(c, 1000.5, 1000.0));
        assert!(!values_match(c, 1002.0, 1000.0));
        assert!(values_match(c, 0.0005, 0.0));
        assert!(!values_match(c, 0.002, 0.0));
        assert!(values_match(c, f64::NAN, f64::NAN));
        assert!(!values_match(c, f64::NAN, 1.0));
        assert!(values_match(c, f64::INFINITY, f64::INFINITY));
        assert!(!values_match(Comparison::Exact, 1.0 + f64::from(f32::EPSILON), 1.0));
    }

    #[test]
    fn unravel_gives_row_major_index() {
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(unravel(0, &[]), Vec::<usize>::new());
    }
}
