//! `Executor`: what runs instructions. The reference interpreter and (later) the remote
//! client implement it, so the script runner and tests drive either the same way.

use crate::{HostTensor, Instr, Span, Train, ValueId};

/// The kinds of failure an executor reports, for callers to match on (they travel on the
/// wire with the message: `gt_transport::Failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FailureKind {
    /// Operands that break the op's type rule (shapes, dtypes, axes).
    Type,
    /// A value that was never defined, was freed, or was not computed because an earlier
    /// instruction failed.
    Undefined,
    /// A memory budget: the worker's (`GT_WORKER_MEMORY`) or the client's
    /// (`GT_CLIENT_MEMORY`).
    OutOfMemory,
    /// Another limit: a tensor or message too large, too much work, the client's credit.
    Limit,
    /// The worker that held the values or ran the instruction is gone.
    WorkerLost,
    /// The connection to the dispatcher broke, or it refused or garbled a message.
    Connection,
    /// A kernel that is malformed or that a code generator refused.
    Kernel,
    /// The device or its driver failed.
    Device,
    /// An instruction stopped while it ran: it took longer than the worker's
    /// `GT_OP_TIMEOUT`, or its client left.
    Cancelled,
    /// A bug in gt caught at run time (a panic): please report it.
    Internal,
}

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

    /// [`Executor::execute_at`] with the instruction handed over: an executor that keeps
    /// instructions (a client batching them) takes a literal's data without copying it.
    fn execute_owned(&mut self, instr: Instr, span: Option<Span>) -> Result<(), Self::Error> {
        self.execute_at(&instr, span)
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

    /// What kind of failure an error is.
    fn error_kind(error: &Self::Error) -> FailureKind;

    /// Runs a training statement (`backward`, `grad`, `sgd`, ...) written at `span`; `site`
    /// names the statement (an optimizer keeps its state per site). `None`: this executor
    /// has no autograd (the frontend's `TensorExecutor` has).
    fn train(&mut self, stmt: &Train, site: usize, span: Option<Span>) -> Option<Result<(), Self::Error>> {
        let _ = (stmt, site, span);
        None
    }
}

/// A borrowed executor is one (so wrappers can own or borrow what they wrap).
impl<E: Executor + ?Sized> Executor for &mut E {
    type Error = E::Error;

    fn execute(&mut self, instr: &Instr) -> Result<(), E::Error> {
        (**self).execute(instr)
    }
    fn execute_at(&mut self, instr: &Instr, span: Option<Span>) -> Result<(), E::Error> {
        (**self).execute_at(instr, span)
    }
    fn execute_owned(&mut self, instr: Instr, span: Option<Span>) -> Result<(), E::Error> {
        (**self).execute_owned(instr, span)
    }
    fn read(&mut self, value: ValueId) -> Result<HostTensor, E::Error> {
        (**self).read(value)
    }
    fn sync(&mut self) -> Result<(), E::Error> {
        (**self).sync()
    }
    fn error_span(error: &E::Error) -> Option<(Span, &'static str)> {
        E::error_span(error)
    }
    fn error_op(error: &E::Error) -> Option<&'static str> {
        E::error_op(error)
    }
    fn error_kind(error: &E::Error) -> FailureKind {
        E::error_kind(error)
    }
    fn train(&mut self, stmt: &Train, site: usize, span: Option<Span>) -> Option<Result<(), E::Error>> {
        (**self).train(stmt, site, span)
    }
}
