//! Debug utilities of the Tensor API: the autograd tape as a list and as text (the Python
//! GT's `gt.debug.get_tape` / `print_tape`).

use crate::autograd::{live_tape, TapeEntry};
use crate::tensor::{Context, Result};
use std::fmt::Write as _;

/// The ops recorded for autograd on the current context that a future `backward` may still
/// use (alive and not yet consumed), in recording order.
pub fn get_tape() -> Result<Vec<TapeEntry>> {
    Ok(live_tape(&*Context::current()?))
}

/// The tape as text: one line per op (`3: %7 = matmul(%1, %2)`) and its result type.
pub fn format_tape(tape: &[TapeEntry]) -> String {
    if tape.is_empty() {
        return "Autograd Tape: Empty (no operations recorded)\n".into();
    }
    let mut out = format!("Autograd Tape ({} operations):\n{}\n", tape.len(), "-".repeat(60));
    for (i, e) in tape.iter().enumerate() {
        let inputs: Vec<String> = e.inputs.iter().map(|v| v.to_string()).collect();
        let _ = writeln!(out, "{i}: {} = {}({})", e.output, e.op, inputs.join(", "));
        let _ = writeln!(out, "   type={}", e.ty);
    }
    out
}

/// Prints the current context's tape to stdout.
pub fn print_tape() -> Result<()> {
    print!("{}", format_tape(&get_tape()?));
    Ok(())
}
