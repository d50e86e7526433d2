//! [`TensorExecutor`]: an `Executor` that runs a script's instructions through the Tensor
//! API, so that autograd sees them and the training statements of `.gtir` (`backward`,
//! `grad`, `sgd`, `adam`, ...) work. Script value ids map to tensors; redefining or freeing an
//! id drops the runner's handle (the remote value lives while autograd still needs it).

use super::{apply_instr, Context, ContextGuard, Misuse, Result, Tensor, TensorError};
use crate::nn::{Adam, Optimizer, Sgd};
use foldhash::{HashMap, HashMapExt};
use gt_ir::{Executor, HostTensor, Instr, Optimizer as OptimizerSpec, Span, Train, ValueId};
use std::collections::BTreeMap;
use std::rc::Rc;

/// Runs instructions and training statements on a context of its own (current while it lives).
pub struct TensorExecutor {
    // Field order is drop order: tensors before the context they belong to. Ordered maps,
    // so the frees at the end come in the same order every run.
    values: BTreeMap<ValueId, Tensor>,
    /// Optimizer state per statement (by address), in the order they first ran.
    optimizers: Vec<Box<dyn Optimizer>>,
    sites: HashMap<usize, usize>,
    guard: Option<ContextGuard>,
    ctx: Rc<Context>,
}

impl TensorExecutor {
    /// Over an executor (a client, an interpreter, a recorder of either).
    pub fn new(exec: impl Executor + 'static) -> TensorExecutor {
        let ctx = Context::new(exec);
        TensorExecutor {
            values: BTreeMap::new(),
            optimizers: Vec::new(),
            sites: HashMap::new(),
            guard: Some(ctx.install()),
            ctx,
        }
    }

    /// Drops every tensor and gives the executor back, if it is an `E`.
    pub fn into_inner<E: 'static>(mut self) -> Option<E> {
        self.values.clear();
        self.optimizers.clear();
        self.guard.take();
        let exec = self.ctx.take_executor()?;
        exec.into_any().downcast::<E>().ok().map(|b| *b)
    }

    fn get(&self, v: ValueId, op: &'static str) -> Result<&Tensor> {
        self.values.get(&v).ok_or_else(|| TensorError::invalid(op, Misuse::UndefinedOperand))
    }

    fn tensors(&self, vs: &[ValueId], op: &'static str) -> Result<Vec<Tensor>> {
        vs.iter().map(|v| self.get(*v, op).cloned()).collect()
    }

    fn run_train(&mut self, stmt: &Train, site: usize) -> Result<()> {
        let op = stmt.keyword();
        match stmt {
            Train::RequiresGrad { values } => {
                for t in self.tensors(values, op)? {
                    t.requires_grad_(true)?;
                }
            }
            Train::Backward { loss } => self.get(*loss, op)?.backward()?,
            Train::Grad { dst, of } => {
                let g = self.get(*of, op)?.grad().ok_or_else(|| TensorError::invalid(op, Misuse::NoGradient))?;
                self.values.insert(*dst, g);
            }
            Train::ZeroGrad { values } => {
                for t in self.tensors(values, op)? {
                    t.zero_grad();
                }
            }
            Train::Step { optimizer, params } => {
                let params = self.tensors(params, op)?;
                if let Some(i) = params.iter().position(|p| !p.is_leaf() || !p.requires_grad()) {
                    return Err(TensorError::invalid(op, Misuse::NotParameter { operand: i + 1 }));
                }
                let index = *self.sites.entry(site).or_insert(self.optimizers.len());
                if index == self.optimizers.len() {
                    self.optimizers.push(new_optimizer(*optimizer, params));
                } else {
                    // Parameters defined again (inside the loop) are new tensors: their
                    // optimizer starts afresh instead of stepping the old ones.
                    let same = {
                        let old = self.optimizers[index].parameters();
                        old.len() == params.len() && old.iter().zip(&params).all(|(a, b)| a.same(b))
                    };
                    if !same {
                        self.optimizers[index] = new_optimizer(*optimizer, params);
                    }
                }
                let opt = &mut self.optimizers[index];
                opt.step()?;
                opt.zero_grad();
            }
        }
        Ok(())
    }
}

fn new_optimizer(spec: OptimizerSpec, params: Vec<Tensor>) -> Box<dyn Optimizer> {
    match spec {
        OptimizerSpec::Sgd { lr, momentum, weight_decay } => {
            Box::new(Sgd::new(params, lr).with_momentum(momentum).with_weight_decay(weight_decay))
        }
        OptimizerSpec::Adam { lr, beta1, beta2, eps } => {
            let mut adam = Adam::new(params, lr);
            adam.betas = (beta1, beta2);
            adam.eps = eps;
            Box::new(adam)
        }
    }
}

impl Executor for TensorExecutor {
    fn error_kind(error: &TensorError) -> gt_ir::FailureKind {
        error.kind()
    }

    type Error = TensorError;

    fn execute(&mut self, instr: &Instr) -> Result<()> {
        let op = instr.mnemonic();
        match instr {
            Instr::Free { src } => {
                self.values.remove(src);
                Ok(())
            }
            Instr::GetData { src } => self.read(*src).map(|_| ()),
            // Through the signal API, so a config's backward signal applies to what the
            // block computes, as it does for `gt::signal::context`.
            Instr::SignalStart { name, compile, backward, place } => {
                crate::signal::enter_compiled(name, *compile, *backward, place.as_ref())
            }
            Instr::SignalEnd { name } => crate::signal::exit(name),
            i if i.is_marker() => self.ctx.submit(instr),
            _ => {
                // Operands renumbered to indices of the tensors handed to apply_instr.
                let operands = instr.operands();
                let tensors = self.tensors(&operands, op)?;
                let mut lowered = instr.clone();
                let results = instr.num_results();
                let mut i = 0;
                lowered.visit_values_mut(&mut |v| {
                    if i >= results {
                        let k = operands.iter().position(|o| o == v).expect("an operand of this instruction");
                        *v = ValueId(k as u32);
                    }
                    i += 1;
                });
                let refs: Vec<&Tensor> = tensors.iter().collect();
                let outs = apply_instr(&lowered, &refs)?;
                for (dst, t) in instr.results().into_iter().zip(outs) {
                    self.values.insert(dst, t);
                }
                Ok(())
            }
        }
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor> {
        self.get(value, "get")?.to_host()
    }

    fn sync(&mut self) -> Result<()> {
        self.ctx.sync()
    }

    fn error_op(error: &TensorError) -> Option<&'static str> {
        match error {
            TensorError::Exec { op, .. } | TensorError::Type { op, .. } | TensorError::Invalid { op, .. } => Some(op),
            _ => None,
        }
    }

    fn train(&mut self, stmt: &Train, site: usize, span: Option<Span>) -> Option<Result<()>> {
        let ctx = self.ctx.clone();
        Some(ctx.at_span(span, || self.run_train(stmt, site)))
    }

    fn execute_at(&mut self, instr: &Instr, span: Option<Span>) -> Result<()> {
        let ctx = self.ctx.clone();
        ctx.at_span(span, || self.execute(instr))
    }
}
