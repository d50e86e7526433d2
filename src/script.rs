//! Loading and running `.gtir` scripts in-process: bytes -> parse -> verify -> run on the
//! reference interpreter. Shared by `gt-run` and the filetest runner so both see the same
//! diagnostics.

use crate::diagnostics::Diag;
use gt_frontend::tensor::TensorExecutor;
use gt_frontend::{run_script, RunOptions, RunSummary, ScriptError};
use gt_ir::text::{self, ParseError};
use gt_ir::{Program, Types, VerifyErrors};
use std::io::Write;

/// A program that parsed and verified.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The program.
    pub program: Program,
    /// The type of every value.
    pub types: Types,
}

/// Why a script did not load.
#[derive(Debug, Clone)]
pub enum LoadError {
    /// Not UTF-8, or a syntax error.
    Parse(ParseError),
    /// It parsed, but the verifier found errors (all of them are here).
    Verify {
        /// The parsed program.
        program: Program,
        /// The errors.
        errors: VerifyErrors,
    },
}

impl LoadError {
    /// The diagnostics to show.
    pub fn diags(&self) -> Vec<Diag> {
        match self {
            LoadError::Parse(e) => vec![Diag::from(e)],
            LoadError::Verify { errors, .. } => errors.0.iter().map(Diag::from).collect(),
        }
    }
}

/// Parses and verifies a script's bytes.
pub fn load(bytes: &[u8]) -> Result<Loaded, LoadError> {
    let program = text::parse_bytes(bytes).map_err(LoadError::Parse)?;
    match gt_ir::verify(&program) {
        Ok(types) => Ok(Loaded { program, types }),
        Err(errors) => Err(LoadError::Verify { program, errors }),
    }
}

/// Runs a loaded script on any executor (a connected client, say); a script that trains
/// needs [`run_training`].
pub fn run_on<E: gt_ir::Executor>(
    loaded: &Loaded,
    exec: &mut E,
    out: &mut dyn Write,
    options: RunOptions,
) -> Result<RunSummary, ScriptError> {
    let summary = run_script(&loaded.program, exec, out, options)?;
    Ok(summary)
}

/// Runs a loaded script on a fresh reference interpreter (through autograd when it trains).
pub fn run_local(loaded: &Loaded, out: &mut dyn Write, options: RunOptions) -> Result<RunSummary, ScriptError> {
    // The budget a worker has (`GT_WORKER_MEMORY`), so that what a worker refuses as out of
    // memory is refused here too, not left to abort the process on a failed allocation.
    let budget = gt_runtime::config::EnvConfig::from_env()
        .map_or_else(|_| gt_runtime::config::default_worker_memory(), |c| c.worker_memory);
    let interp = gt_runtime::Interpreter::new().with_memory_budget(budget);
    run_any(loaded, interp, out, options).0
}

/// Runs a loaded script on an executor it owns meanwhile (through autograd when the script
/// trains) and gives the executor back.
pub fn run_any<E: gt_ir::Executor + 'static>(
    loaded: &Loaded,
    mut exec: E,
    out: &mut dyn Write,
    options: RunOptions,
) -> (Result<RunSummary, ScriptError>, Option<E>) {
    if loaded.program.trains() {
        return run_training(loaded, exec, out, options);
    }
    let result = run_script(&loaded.program, &mut exec, out, options);
    (result, Some(exec))
}

/// Runs a script with training statements: its instructions go through the Tensor API
/// (`TensorExecutor`) so that autograd sees them, on `exec`, which is given back after.
pub fn run_training<E: gt_ir::Executor + 'static>(
    loaded: &Loaded,
    exec: E,
    out: &mut dyn Write,
    options: RunOptions,
) -> (Result<RunSummary, ScriptError>, Option<E>) {
    let mut tensors = TensorExecutor::new(exec);
    let result = run_script(&loaded.program, &mut tensors, out, options);
    (result, tensors.into_inner::<E>())
}

/// The source as text for rendering (lossy where it is not UTF-8; offsets before the
/// first bad byte are unchanged, which is where a UTF-8 error points).
pub fn source_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
