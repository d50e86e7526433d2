//! `Executor`: what runs instructions. The reference interpreter and (later) the remote
//! client implement it, so the script runner and tests drive either the same way.

use crate::{HostTensor, Instr, ValueId};

/// Runs a stream of instructions and answers data requests.
pub trait Executor {
    /// Why an instruction or a read failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Runs one instruction. An executor may run it later (asynchronously); an error it
    /// finds then is returned by a later call, naming the instruction.
    fn execute(&mut self, instr: &Instr) -> Result<(), Self::Error>;

    /// Returns a value's data (a sync point).
    fn read(&mut self, value: ValueId) -> Result<HostTensor, Self::Error>;
}
