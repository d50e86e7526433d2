//! The context a thread's tensors run on: an executor (the async client of a dispatcher, or
//! the reference interpreter), the client's value ids, the random seed sequence, the
//! grad-enabled flag and the autograd tape. One context is current per thread
//! ([`Context::install`]); every tensor keeps the context it was made on.

use super::TensorError;
use crate::autograd::GradNode;
use gt_ir::random;
use gt_ir::{Executor, FailureKind, HostTensor, Instr, Span, ValueId};
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

/// Why an executor call failed, with the op it was about when the executor knows it.
#[derive(Debug, Clone)]
pub struct ExecFailure {
    /// The op that failed (for failures reported late, an earlier one than the call).
    pub op: Option<&'static str>,
    /// What kind of failure.
    pub kind: FailureKind,
    /// The executor's message.
    pub message: String,
}

/// An object-safe [`Executor`]: what a [`Context`] drives. Every `Executor` is one.
pub trait DynExecutor {
    /// Queues or runs one instruction, issued for `span` of a script (if any).
    fn submit(&mut self, instr: &Instr, span: Option<Span>) -> Result<(), ExecFailure>;
    /// Queues an instruction handed over (a literal's data is not copied).
    fn submit_owned(&mut self, instr: Instr, span: Option<Span>) -> Result<(), ExecFailure>;
    /// A value's data (a sync point).
    fn fetch(&mut self, value: ValueId) -> Result<HostTensor, ExecFailure>;
    /// Waits for everything submitted; reports failures not reported yet.
    fn wait(&mut self) -> Result<(), ExecFailure>;
    /// The executor itself, to take back its concrete type ([`Context::take_executor`]).
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
    /// The executor itself, to reach its own methods ([`Context::with_executor`]).
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

impl<E: Executor + 'static> DynExecutor for E {
    fn submit(&mut self, instr: &Instr, span: Option<Span>) -> Result<(), ExecFailure> {
        self.execute_at(instr, span).map_err(failure::<E>)
    }
    fn submit_owned(&mut self, instr: Instr, span: Option<Span>) -> Result<(), ExecFailure> {
        self.execute_owned(instr, span).map_err(failure::<E>)
    }
    fn fetch(&mut self, value: ValueId) -> Result<HostTensor, ExecFailure> {
        self.read(value).map_err(failure::<E>)
    }
    fn wait(&mut self) -> Result<(), ExecFailure> {
        self.sync().map_err(failure::<E>)
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

fn failure<E: Executor>(e: E::Error) -> ExecFailure {
    ExecFailure { op: E::error_op(&e), kind: E::error_kind(&e), message: e.to_string() }
}

/// A thread's tensor runtime. Cheap to share (`Rc`); not `Send`: use one per thread.
pub struct Context {
    exec: RefCell<Option<Box<dyn DynExecutor>>>,
    /// Frees that arrived while the executor was busy (a tensor dropped inside a call).
    pending_frees: RefCell<Vec<ValueId>>,
    next_id: Cell<u32>,
    seed_base: Cell<u64>,
    seed_count: Cell<u64>,
    /// Live `no_grad` guards (a count, so guards may drop in any order).
    no_grad_depth: Cell<u32>,
    pub(crate) tape: RefCell<Vec<Weak<GradNode>>>,
    pub(crate) node_seq: Cell<u64>,
    tape_prune_at: Cell<usize>,
    /// The script span the ops issued now come from (a `.gtir` statement run as tensors),
    /// so that failures and profiles name its line.
    span: Cell<Option<Span>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Context>>> = const { RefCell::new(None) };
}

impl Context {
    /// A context over an executor (a `gt_frontend::Client`, `gt_runtime::Interpreter`, ...).
    pub fn new(exec: impl Executor + 'static) -> Rc<Context> {
        Context::from_boxed(Box::new(exec))
    }

    /// A context over an already boxed executor.
    pub fn from_boxed(exec: Box<dyn DynExecutor>) -> Rc<Context> {
        Rc::new(Context {
            exec: RefCell::new(Some(exec)),
            pending_frees: RefCell::new(Vec::new()),
            next_id: Cell::new(0),
            seed_base: Cell::new(0x6774_5f73_6565_6421),
            seed_count: Cell::new(0),
            no_grad_depth: Cell::new(0),
            tape: RefCell::new(Vec::new()),
            node_seq: Cell::new(0),
            tape_prune_at: Cell::new(1024),
            span: Cell::new(None),
        })
    }

    /// Makes this the thread's current context (what `gt::randn` and friends use) until
    /// the guard is dropped; the previous one is current again then.
    pub fn install(self: &Rc<Context>) -> ContextGuard {
        let previous = CURRENT.with(|c| c.replace(Some(self.clone())));
        ContextGuard { previous: Some(previous), context: self.clone() }
    }

    /// The thread's current context.
    pub fn current() -> Result<Rc<Context>, TensorError> {
        CURRENT.with(|c| c.borrow().clone()).ok_or(TensorError::NoRuntime)
    }

    /// Stops using the executor: it is dropped now (a client flushes and says goodbye), and
    /// every later call on this context's tensors fails with [`TensorError::Closed`].
    pub fn close(&self) {
        drop(self.take_executor());
    }

    /// As [`Context::close`], giving the executor back (`None` if it was taken already).
    pub fn take_executor(&self) -> Option<Box<dyn DynExecutor>> {
        let mut exec = self.exec.borrow_mut().take()?;
        // A failure here is the executor's to report at its next wait, which never comes.
        let _ = self.send_pending_frees(exec.as_mut());
        Some(exec)
    }

    /// Whether [`Context::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.exec.try_borrow().map(|e| e.is_none()).unwrap_or(false)
    }

    /// Runs `f` on the executor if it is an `E` (a `Client`'s statistics, say), after the
    /// frees that waited; `None` when it is another type or closed.
    pub fn with_executor<E: 'static, R>(&self, f: impl FnOnce(&mut E) -> R) -> Option<R> {
        self.with_exec(|e| Ok(e.as_any_mut().downcast_mut::<E>().map(f)), "stats").ok().flatten()
    }

    /// A fresh value id.
    pub(crate) fn fresh_id(&self) -> ValueId {
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        ValueId(id)
    }

    /// Runs `f` on the executor, after sending the frees that waited.
    fn with_exec<T>(
        &self,
        f: impl FnOnce(&mut dyn DynExecutor) -> Result<T, ExecFailure>,
        op: &'static str,
    ) -> Result<T, TensorError> {
        let mut guard = self.exec.borrow_mut();
        let exec = guard.as_mut().ok_or(TensorError::Closed)?;
        self.send_pending_frees(exec.as_mut()).map_err(|e| exec_error(op, e))?;
        f(exec.as_mut()).map_err(|e| exec_error(op, e))
    }

    /// Sends the frees that arrived while the executor was busy.
    fn send_pending_frees(&self, exec: &mut dyn DynExecutor) -> Result<(), ExecFailure> {
        let frees = std::mem::take(&mut *self.pending_frees.borrow_mut());
        frees.into_iter().try_for_each(|src| exec.submit(&Instr::Free { src }, None))
    }

    /// Queues an instruction.
    pub(crate) fn submit(&self, instr: &Instr) -> Result<(), TensorError> {
        self.with_exec(|e| e.submit(instr, self.span.get()), instr.mnemonic())
    }

    /// Queues an instruction handed over (a literal's data moves to the executor).
    pub(crate) fn submit_owned(&self, instr: Instr) -> Result<(), TensorError> {
        let op = instr.mnemonic();
        self.with_exec(|e| e.submit_owned(instr, self.span.get()), op)
    }

    /// Runs `f` with the ops it issues attributed to `span` of a script.
    pub(crate) fn at_span<T>(&self, span: Option<Span>, f: impl FnOnce() -> T) -> T {
        let outer = self.span.replace(span);
        let result = f();
        self.span.set(outer);
        result
    }

    /// A value's data.
    pub(crate) fn fetch(&self, value: ValueId) -> Result<HostTensor, TensorError> {
        self.with_exec(|e| e.fetch(value), "get")
    }

    /// Waits until everything queued has run; reports any failure.
    pub fn sync(&self) -> Result<(), TensorError> {
        self.with_exec(|e| e.wait(), "sync")
    }

    /// Frees a value remotely (from a tensor's drop: never fails, never panics).
    pub(crate) fn free(&self, src: ValueId) {
        match self.exec.try_borrow_mut() {
            Ok(mut guard) => {
                if let Some(exec) = guard.as_mut() {
                    // A failure here is reported by the executor at the next wait.
                    let _ = exec.submit(&Instr::Free { src }, None);
                }
            }
            Err(_) => self.pending_frees.borrow_mut().push(src),
        }
    }

    /// The seed of the next random tensor: the sequence set by [`Context::manual_seed`].
    pub(crate) fn next_seed(&self) -> u64 {
        let n = self.seed_count.get();
        self.seed_count.set(n + 1);
        // splitmix64 spreads consecutive seeds over the whole range.
        random::splitmix64(self.seed_base.get().wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// Restarts the random sequence: the same seed gives the same tensors in the same order.
    pub fn manual_seed(&self, seed: u64) {
        self.seed_base.set(seed);
        self.seed_count.set(0);
    }

    /// Whether ops record gradients (false inside [`no_grad`]).
    pub fn is_grad_enabled(&self) -> bool {
        self.no_grad_depth.get() == 0
    }

    /// Gradient recording off on this context until the guard is dropped ([`no_grad`] for
    /// the current one).
    pub fn no_grad(self: &Rc<Context>) -> NoGradGuard {
        self.no_grad_depth.set(self.no_grad_depth.get() + 1);
        NoGradGuard { context: Some(self.clone()) }
    }

    /// Records a node on the tape (for `debug::get_tape`); drops dead entries now and then so
    /// the tape stays as long as the live graph.
    pub(crate) fn record(&self, node: &Rc<GradNode>) {
        let mut tape = self.tape.borrow_mut();
        tape.push(Rc::downgrade(node));
        if tape.len() >= self.tape_prune_at.get() {
            tape.retain(|w| w.upgrade().is_some_and(|n| !n.is_released()));
            self.tape_prune_at.set((tape.len() * 2).max(1024));
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("closed", &self.is_closed())
            .field("next_id", &self.next_id.get())
            .field("grad_enabled", &self.is_grad_enabled())
            .finish()
    }
}

fn exec_error(op: &'static str, e: ExecFailure) -> TensorError {
    TensorError::Exec { op: e.op.unwrap_or(op), kind: e.kind, executor_message: e.message }
}

/// Keeps a context current; restores the previous one when dropped.
#[must_use = "the context is current only while the guard lives"]
pub struct ContextGuard {
    previous: Option<Option<Rc<Context>>>,
    context: Rc<Context>,
}

impl ContextGuard {
    /// The context it installed.
    pub fn context(&self) -> &Rc<Context> {
        &self.context
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
}

/// Gradient recording off until the guard is dropped (PyTorch's `torch.no_grad()`), on the
/// current context. Without a context it does nothing.
pub fn no_grad() -> NoGradGuard {
    match Context::current() {
        Ok(c) => c.no_grad(),
        Err(_) => NoGradGuard { context: None },
    }
}

/// Ends its share of gradient-free recording when dropped (guards may drop in any order).
#[must_use = "gradients are off only while the guard lives"]
pub struct NoGradGuard {
    context: Option<Rc<Context>>,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        if let Some(c) = &self.context {
            c.no_grad_depth.set(c.no_grad_depth.get().saturating_sub(1));
        }
    }
}

/// Whether the current context records gradients (false without a context).
pub fn is_grad_enabled() -> bool {
    Context::current().is_ok_and(|c| c.is_grad_enabled())
}

/// Restarts the current context's random sequence.
pub fn manual_seed(seed: u64) -> Result<(), TensorError> {
    Context::current().map(|c| c.manual_seed(seed))
}
