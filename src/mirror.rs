//! [`Mirror`]: runs every instruction on the reference interpreter and on another backend
//! (the GPU), and compares every value read within a tolerance. The CUDA tests run every
//! filetest and property test through it.

use crate::script::{load, run_any, run_local, Loaded};
use gt_frontend::script::RunOptions;
use gt_ir::{Executor, HostTensor, Instr, Shape, TensorType, ValueId};
use gt_runtime::backend::Backend;
use gt_runtime::{Interpreter, RuntimeError};
use std::path::Path;
use thiserror::Error;

/// `|got - want| <= ABS + REL * |want|` per element; NaN matches NaN, infinities match
/// exactly. The GPU's `exp`/`log`/`pow` are correct to about 2^-22 relative, sums differ in
/// rounding order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub abs: f32,
    /// Relative part.
    pub rel: f32,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance { abs: 1e-5, rel: 1e-4 }
    }
}

impl Tolerance {
    /// Whether `got` is close enough to `want`.
    pub fn accepts(self, got: f32, want: f32) -> bool {
        close(got, want, self.abs, self.rel)
    }

    /// [`Tolerance::accepts`] for `f64` values.
    pub fn accepts_f64(self, got: f64, want: f64) -> bool {
        close(got, want, f64::from(self.abs), f64::from(self.rel))
    }

    /// This tolerance for values of `dtype`: halves are rounded once from an `f32` that the
    /// backends may compute in another order (or with another `exp`), so results one unit
    /// in the last place apart both are right.
    pub fn for_dtype(self, dtype: gt_ir::DType) -> Tolerance {
        let ulp = match dtype {
            gt_ir::DType::BF16 => 1.0 / 128.0,
            gt_ir::DType::F16 => 1.0 / 1024.0,
            _ => 0.0,
        };
        Tolerance { abs: self.abs, rel: self.rel.max(ulp) }
    }
}

/// Whether `got` is within `abs + rel |want|` of `want` (NaN only matches NaN, an infinity
/// only itself).
fn close<T: num_traits::Float>(got: T, want: T, abs: T, rel: T) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return want == got;
    }
    (got - want).abs() <= abs + rel * want.abs()
}

/// The first index where `same` rejects `got` against `want`, with both elements printed.
fn first_apart<T: Copy + std::fmt::Debug>(
    got: &[T],
    want: &[T],
    same: impl Fn(T, T) -> bool,
) -> Option<(usize, String, String)> {
    (0..want.len()).find(|&i| !same(got[i], want[i])).map(|i| (i, format!("{:?}", got[i]), format!("{:?}", want[i])))
}

/// Why a mirrored run failed.
#[derive(Debug, Error)]
pub enum MirrorError {
    /// Both backends refused the instruction (the script's own error).
    #[error("{0}")]
    Both(RuntimeError),
    /// Only one of them did.
    #[error("the backends disagree on `{op}`: interpreter {reference}, {backend} {other}")]
    Disagree {
        /// The op.
        op: &'static str,
        /// The interpreter's outcome.
        reference: Outcome,
        /// The other backend's name.
        backend: &'static str,
        /// Its outcome.
        other: Outcome,
    },
    /// A value read differs beyond the tolerance.
    #[error("value {value} differs: {backend} gives {got} at element {index} (shape {shape}), the interpreter {want}")]
    Differs {
        /// The value.
        value: ValueId,
        /// The backend.
        backend: &'static str,
        /// First differing element (row-major).
        index: usize,
        /// Its value on the backend, as printed.
        got: String,
        /// The interpreter's.
        want: String,
        /// The value's shape.
        shape: Shape,
    },
    /// A value read has another type on the backend.
    #[error("value {value} differs: {backend} gives a {got} value, the interpreter a {want} one")]
    TypeDiffers {
        /// The value.
        value: ValueId,
        /// The backend.
        backend: &'static str,
        /// Its type on the backend.
        got: TensorType,
        /// The interpreter's.
        want: TensorType,
    },
}

/// How one backend did on an instruction: `succeeds`, or `fails (why)`.
#[derive(Debug)]
pub struct Outcome(pub Result<(), RuntimeError>);

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Ok(()) => f.write_str("succeeds"),
            Err(e) => write!(f, "fails ({e})"),
        }
    }
}

/// Runs both, compares reads.
pub struct Mirror {
    reference: Interpreter,
    other: Box<dyn Backend>,
    tolerance: Tolerance,
    /// Values compared so far, and their elements.
    pub compared: (usize, usize),
    /// Values only the reference holds: results of instructions the backend refused by dtype
    /// ([`RuntimeError::refuses_dtype`]), and of those that read such values.
    unmirrored: std::collections::HashSet<ValueId>,
}

impl Mirror {
    /// Mirrors the interpreter onto `other`.
    pub fn new(other: Box<dyn Backend>, tolerance: Tolerance) -> Mirror {
        Mirror { reference: Interpreter::new(), other, tolerance, compared: (0, 0), unmirrored: Default::default() }
    }
}

impl Executor for Mirror {
    type Error = MirrorError;

    /// Both executors' kind when they agree; a disagreement is a bug of the backend.
    fn error_kind(error: &MirrorError) -> gt_ir::FailureKind {
        match error {
            MirrorError::Both(e) => e.kind(),
            MirrorError::Disagree { .. } | MirrorError::Differs { .. } | MirrorError::TypeDiffers { .. } => {
                gt_ir::FailureKind::Internal
            }
        }
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), MirrorError> {
        let want = self.reference.execute(instr);
        let got = self.other.execute(instr);
        let skipped = |e: &RuntimeError, unmirrored: &std::collections::HashSet<ValueId>| match e {
            e if e.refuses_dtype() => true,
            RuntimeError::Undefined { value, .. } => unmirrored.contains(value),
            _ => false,
        };
        match (want, got) {
            (Ok(()), Ok(())) => {
                for v in instr.results() {
                    self.unmirrored.remove(&v);
                }
                Ok(())
            }
            // Work in a dtype the backend does not take stays on the reference.
            (Ok(()), Err(e)) if skipped(&e, &self.unmirrored) => {
                self.unmirrored.extend(instr.results());
                Ok(())
            }
            (Err(a), Err(b)) if a == b => Err(MirrorError::Both(a)),
            // Work the backend could not take part in: the reference's error is the answer
            // (a comparison's `bool` stayed on the reference, then `neg` of it is refused).
            (Err(a), Err(b)) if skipped(&b, &self.unmirrored) => Err(MirrorError::Both(a)),
            (want, got) => Err(MirrorError::Disagree {
                op: instr.mnemonic(),
                reference: Outcome(want),
                backend: self.other.name(),
                other: Outcome(got),
            }),
        }
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, MirrorError> {
        if self.unmirrored.contains(&value) {
            return self.reference.read(value).map_err(MirrorError::Both);
        }
        let want = self.reference.read(value);
        let got = self.other.read(value);
        let (want, got) = match (want, got) {
            (Ok(w), Ok(g)) => (w, g),
            (Err(a), Err(b)) if a == b => return Err(MirrorError::Both(a)),
            (want, got) => {
                return Err(MirrorError::Disagree {
                    op: "get",
                    reference: Outcome(want.map(|_| ())),
                    backend: self.other.name(),
                    other: Outcome(got.map(|_| ())),
                })
            }
        };
        let backend = self.other.name();
        if got.ty != want.ty {
            return Err(MirrorError::TypeDiffers { value, backend, got: got.ty, want: want.ty });
        }
        // The types are equal, so are the dtypes: integers and bools exactly, f64 in f64,
        // f32 and halves as f32.
        let tolerance = self.tolerance.for_dtype(want.ty.dtype);
        let differs = match want.ty.dtype {
            gt_ir::DType::F64 => {
                first_apart(&got.data.to_f64(), &want.data.to_f64(), |g, w| tolerance.accepts_f64(g, w))
            }
            d if d.is_float() => first_apart(&got.data.to_f32(), &want.data.to_f32(), |g, w| tolerance.accepts(g, w)),
            _ => {
                use gt_ir::data::Elements;
                match (got.data.cast(gt_ir::DType::I64), want.data.cast(gt_ir::DType::I64)) {
                    (Elements::I64(g), Elements::I64(w)) => first_apart(&g, &w, |g, w| g == w),
                    _ => unreachable!("a cast to i64 gives i64"),
                }
            }
        };
        if let Some((index, got, want_element)) = differs {
            let shape = want.ty.shape.clone();
            return Err(MirrorError::Differs { value, backend, index, got, want: want_element, shape });
        }
        self.compared.0 += 1;
        self.compared.1 += want.data.len();
        Ok(want)
    }

    fn sync(&mut self) -> Result<(), MirrorError> {
        self.other.finish().map_err(|e| MirrorError::Disagree {
            op: "sync",
            reference: Outcome(Ok(())),
            backend: self.other.name(),
            other: Outcome(Err(e)),
        })
    }
}

/// What [`check_scripts`] found.
#[derive(Debug, Default)]
pub struct ScriptsReport {
    /// Scripts run.
    pub files: usize,
    /// Values read and compared, and their elements.
    pub compared: (usize, usize),
    /// One entry per script whose output differed, or that failed on one side only.
    pub failures: Vec<String>,
}

impl ScriptsReport {
    /// One line: how much was compared.
    pub fn summary(&self) -> String {
        format!(
            "{} scripts, {} values ({} elements) compared, {} differ",
            self.files,
            self.compared.0,
            self.compared.1,
            self.failures.len()
        )
    }
}

/// Runs every run filetest (`tests/gtir/run`) and example (`examples/`) under `root`
/// mirrored onto a fresh backend from `make`, and compares each script's output with the
/// interpreter's: the filetest snapshot, or what an example prints.
pub fn check_scripts(root: &Path, make: &mut dyn FnMut() -> Box<dyn Backend>, tolerance: Tolerance) -> ScriptsReport {
    let files = crate::filetest::run_scripts(root);
    let mut report = ScriptsReport { files: files.len(), ..Default::default() };
    for path in &files {
        let Ok(bytes) = std::fs::read(path) else { continue };
        let mut compared = (0, 0);
        let mut mirrored = |loaded: &Loaded, out: &mut dyn std::io::Write| {
            let (r, mirror) = run_any(loaded, Mirror::new(make(), tolerance), out, RunOptions::default());
            compared = mirror.map_or((0, 0), |m| m.compared);
            r
        };
        let outputs = if crate::filetest::directives(&String::from_utf8_lossy(&bytes)).is_ok() {
            let want = crate::filetest::run_file(path).map_err(|e| format!("{e:#}"));
            (want, crate::filetest::run_file_on(path, &mut mirrored).map_err(|e| format!("{e:#}")))
        } else {
            match load(&bytes) {
                Ok(loaded) => {
                    let (mut want, mut got) = (Vec::new(), Vec::new());
                    let w = run_local(&loaded, &mut want, RunOptions::default()).map_err(|e| e.to_string());
                    let g = mirrored(&loaded, &mut got).map_err(|e| e.to_string());
                    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
                    (w.map(|_| text(want)), g.map(|_| text(got)))
                }
                Err(e) => (Err(format!("{e:?}")), Err(String::new())),
            }
        };
        report.compared.0 += compared.0;
        report.compared.1 += compared.1;
        match outputs {
            (Ok(want), Ok(got)) if got == want => {}
            (Ok(want), Ok(got)) => {
                report.failures.push(format!("{}:\n--- interpreter\n{want}\n--- mirrored\n{got}", path.display()))
            }
            (want, got) => report.failures.push(format!("{}: interpreter {want:?}, mirrored {got:?}", path.display())),
        }
    }
    report
}
