//! `Executor`: what runs instructions. The reference interpreter and (later) the remote
//! client implement it, so the script runner and tests drive either the same way.

use crate::{HostTensor, Instr, Span, ValueId};

/// Runs a stream of instructions and answers data requests.
pub trait Executor {
    /// Why an instruction or a read failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Runs one instruction. An executor may run it later (asynchronously); an error it
    /// finds then is returned by a later call, naming the instruction.
    fn execute(&mut self, instr: &Instr) -> Result<(), Self::Error>;

    /// Runs one instruction that came from `span` of a script (remembered by executors that
    /// report failures later, so the failure can point at its line).
    fn execute_at(&mut self, instr: &Instr, span: Option<Span>) -> Result<(), Self::Error> {
        let _ = span;
        self.execute(instr)
    }

    /// Returns a value's data (a sync point).
    fn read(&mut self, value: ValueId) -> Result<HostTensor, Self::Error>;

    /// Waits until every instruction has run, reporting any failure not reported yet (the
    /// end of a script). Synchronous executors have nothing to wait for.
    fn sync(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// For an error about an earlier instruction than the call that returned it: that
    /// instruction's span and op.
    fn error_span(error: &Self::Error) -> Option<(Span, &'static str)> {
        let _ = error;
        None
    }

    /// For an error about an instruction: its op (an earlier one than the call, for
    /// failures reported late).
    fn error_op(error: &Self::Error) -> Option<&'static str> {
        Self::error_span(error).map(|(_, op)| op)
    }
}
