//! Signals: named scopes of the instruction stream (the Python GT's `gt.signal`). Every op
//! issued inside `signal::context("layer1")` travels between `signal_start "layer1"` and
//! `signal_end "layer1"` markers, so the dispatcher's passes (placement, compilation) and the
//! instruction log see which signal each instruction belongs to. A scope's *backward signal*
//! (given, or the `backward:` of its config) scopes the gradient ops of what it computed.
//! A config's `compile: true` travels on the scope's `signal_start` marker, and the
//! dispatcher's fuse pass compiles the scope; its `dtype: bf16` runs the scope under
//! autocast ([`crate::tensor::autocast`]). Configs come from YAML ([`crate::config`]):
//! [`load_config`], or `GT_CONFIG` at start.

use crate::config::{Config, SignalConfig, SignalConfigError};
use crate::tensor::{Context, Misuse, Result, Tensor, TensorError};
use gt_ir::{Instr, Placement};
use std::cell::RefCell;
use std::rc::Rc;

/// An open signal scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The signal.
    pub name: String,
    /// The signal of the gradients of what is computed in the scope, if any.
    pub backward: Option<String>,
    /// The mixed-precision dtype its config names (`dtype: bf16`), if any.
    pub dtype: Option<gt_ir::DType>,
}

thread_local! {
    static STACK: RefCell<Vec<Rc<Scope>>> = const { RefCell::new(Vec::new()) };
    static CONFIG: RefCell<Config> = RefCell::new(Config::default());
}

/// Opens a scope on the current context until the guard is dropped (its backward signal:
/// the config's `backward:` for `name`, if any).
pub fn context(name: &str) -> Result<SignalGuard> {
    let backward = config(name).and_then(|c| c.backward);
    context_with_backward(name, backward.as_deref())
}

/// Opens a scope whose gradient ops run in signal `backward` (pipeline stages).
pub fn context_with_backward(name: &str, backward: Option<&str>) -> Result<SignalGuard> {
    let ctx = Context::current()?;
    let scope = enter_on(&ctx, name, backward, false)?;
    Ok(SignalGuard { ctx, scope, open: true })
}

/// Opens a scope without a guard; close it with [`exit`] (innermost first).
pub fn enter(name: &str) -> Result<()> {
    enter_compiled(name, false, false, None)
}

/// [`enter`], compiling the scope also when `compile` (a script's `signal_start "x" compile`).
/// `place`: a placement the script wrote, which wins over the config's.
/// `is_backward`: the script marked it a backward signal.
pub(crate) fn enter_compiled(name: &str, compile: bool, is_backward: bool, place: Option<&Placement>) -> Result<()> {
    let backward = config(name).and_then(|c| c.backward);
    let ctx = Context::current()?;
    enter_marked(&ctx, start_marker(name, compile, is_backward, place), name, backward.as_deref()).map(|_| ())
}

/// The marker that opens signal `name`: compiled when `compile` (a script wrote
/// `signal_start "x" compile`) or when the thread's config says `compile: true` for it;
/// placed as `place` says (a script wrote it) or else as the config's `shard:` says.
/// `backward`: it opens a backward signal.
pub fn start_marker(name: &str, compile: bool, backward: bool, place: Option<&Placement>) -> Instr {
    let config = config(name);
    let place = place.cloned().or_else(|| config.as_ref().and_then(|c| c.shard.as_ref()).map(placement));
    let compile = compile || config.is_some_and(|c| c.compile);
    Instr::SignalStart { name: name.to_string(), compile, backward, place }
}

/// The marker that opens the backward signal of a scope, around the gradient ops of what it
/// computed: a configured backward signal (`backward:` in the config, or given) takes its
/// own config as [`start_marker`] does; without one, the gradients run in a backward scope
/// of the forward signal's own name, without its directives (its placement and compilation
/// were for the forward values), so profiles still file them under that layer's backward.
pub(crate) fn backward_marker(name: &str, configured: bool) -> Instr {
    if configured {
        start_marker(name, false, true, None)
    } else {
        Instr::SignalStart { name: name.to_string(), compile: false, backward: true, place: None }
    }
}

/// A config's `shard:` as the placement its signal's marker carries.
pub fn placement(shard: &crate::config::ShardConfig) -> Placement {
    let workers = shard.workers.iter().flatten().map(|&w| u32::try_from(w).unwrap_or(u32::MAX)).collect();
    if shard.replicated {
        Placement::Replicated { workers }
    } else {
        Placement::Split { axis: shard.axis, workers }
    }
}

/// Closes the innermost scope, which must be `name`.
pub fn exit(name: &str) -> Result<()> {
    exit_on(&*Context::current()?, name)
}

fn enter_on(ctx: &Context, name: &str, backward: Option<&str>, compile: bool) -> Result<Rc<Scope>> {
    enter_marked(ctx, start_marker(name, compile, false, None), name, backward)
}

fn enter_marked(ctx: &Context, marker: Instr, name: &str, backward: Option<&str>) -> Result<Rc<Scope>> {
    if name.is_empty() {
        return Err(TensorError::invalid("signal", Misuse::UnnamedSignal));
    }
    ctx.submit(&marker)?;
    let dtype = config(name).and_then(|c| c.dtype);
    let scope = Rc::new(Scope { name: name.to_string(), backward: backward.map(str::to_string), dtype });
    STACK.with(|s| s.borrow_mut().push(scope.clone()));
    Ok(scope)
}

/// Closes `scope` and every scope opened inside it that is still open (innermost first), so
/// the stream stays nested whatever order guards drop in. Nothing if it is closed already.
fn close_scope(ctx: &Context, scope: &Rc<Scope>) -> Result<()> {
    let Some(at) = STACK.with(|s| s.borrow().iter().position(|t| Rc::ptr_eq(t, scope))) else { return Ok(()) };
    let closing: Vec<Rc<Scope>> = STACK.with(|s| s.borrow_mut().split_off(at));
    let mut result = Ok(());
    for t in closing.iter().rev() {
        let r = ctx.submit(&Instr::SignalEnd { name: t.name.clone() });
        if result.is_ok() {
            result = r;
        }
    }
    result
}

fn exit_on(ctx: &Context, name: &str) -> Result<()> {
    let top = STACK.with(|s| s.borrow().last().map(|t| t.name.clone()));
    match top {
        Some(t) if t == name => {
            STACK.with(|s| s.borrow_mut().pop());
            ctx.submit(&Instr::SignalEnd { name: name.to_string() })
        }
        Some(innermost) => {
            Err(TensorError::invalid("signal", Misuse::SignalNotInnermost { name: name.to_string(), innermost }))
        }
        None => Err(TensorError::invalid("signal", Misuse::NoOpenSignal { name: name.to_string() })),
    }
}

/// Closes its scope when dropped.
#[must_use = "the scope closes when the guard is dropped"]
pub struct SignalGuard {
    ctx: Rc<Context>,
    scope: Rc<Scope>,
    open: bool,
}

impl SignalGuard {
    /// Closes the scope (and any still open inside it) now, reporting a failure; dropping
    /// closes it too, silently.
    pub fn close(mut self) -> Result<()> {
        self.open = false;
        close_scope(&self.ctx, &self.scope)
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        if self.open {
            // A closed runtime: nothing to report from a drop.
            let _ = close_scope(&self.ctx, &self.scope);
        }
    }
}

/// The mixed-precision dtype of the innermost open scope whose config names one.
pub(crate) fn autocast_dtype() -> Option<gt_ir::DType> {
    STACK.with(|s| s.borrow().iter().rev().find_map(|t| t.dtype))
}

/// The innermost open scope.
pub fn current() -> Option<Rc<Scope>> {
    STACK.with(|s| s.borrow().last().cloned())
}

/// The open scopes, outermost first.
pub fn stack() -> Vec<String> {
    STACK.with(|s| s.borrow().iter().map(|t| t.name.clone()).collect())
}

/// `t` copied into signal `name` (the Python GT's `gt.signal.tensor`): the copy is made
/// inside the scope, so a placement config for `name` decides where it lives. Gradients
/// flow through it.
pub fn tensor(t: &Tensor, name: &str) -> Result<Tensor> {
    let _scope = context(name)?;
    let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    t.reshape(&dims)
}

/// Loads a YAML signal config and makes it this thread's (replacing the previous one).
pub fn load_config(path: impl AsRef<std::path::Path>) -> Result<Config, SignalConfigError> {
    let config = Config::load(path)?;
    set_config(config.clone());
    Ok(config)
}

/// Makes `config` this thread's signal config.
pub fn set_config(config: Config) {
    CONFIG.with(|c| *c.borrow_mut() = config);
}

/// Adds or replaces one signal's config (the Python GT's `register_config`).
pub fn register_config(name: &str, config: SignalConfig) {
    CONFIG.with(|c| c.borrow_mut().insert(name, config));
}

/// The config of signal `name`, if any.
pub fn config(name: &str) -> Option<SignalConfig> {
    CONFIG.with(|c| c.borrow().signal(name).cloned())
}
