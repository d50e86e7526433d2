//! The kernels a script compiles to: [`KernelRecorder`] runs a script on the reference
//! interpreter while lowering every instruction it executes ([`gt_ir::kernel::lower`]), so
//! `gt-run --dump-kernels DIR` can write each distinct kernel's IR and PTX, and CI can
//! assemble the PTX of every kernel the filetests use.

use gt_ir::kernel::lower::{lower, Step};
use gt_ir::kernel::{BufferStorage, Kernel};
use gt_ir::verify::shape;
use gt_ir::{Executor, HostTensor, Instr, Span, TensorType, ValueId};
use gt_runtime::backend::cuda::ptx;
use gt_runtime::{Interpreter, RuntimeError};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Runs instructions on the interpreter and keeps every distinct kernel they lower to, in
/// first-use order, with the storage of its buffers.
#[derive(Debug, Default)]
pub struct KernelRecorder {
    interp: Interpreter,
    types: HashMap<ValueId, TensorType>,
    seen: HashSet<(Kernel, BufferStorage)>,
    /// The kernels, each once per storage of its buffers.
    pub kernels: Vec<Kernel>,
    /// `storage[i]`: how the buffers of `kernels[i]` are stored on a GPU.
    pub storage: Vec<BufferStorage>,
}

impl KernelRecorder {
    /// A recorder with no values.
    pub fn new() -> KernelRecorder {
        KernelRecorder::default()
    }

    /// Writes `NNN.kernel` (kernel IR) and `NNN.ptx` per kernel into `dir`; returns how many.
    pub fn write(&self, dir: &Path) -> anyhow::Result<usize> {
        std::fs::create_dir_all(dir)?;
        for (i, (kernel, storage)) in self.kernels.iter().zip(&self.storage).enumerate() {
            std::fs::write(dir.join(format!("{i:03}-{}.kernel", kernel.kind())), format!("{kernel}\n"))?;
            match ptx::generate_stored(kernel, storage) {
                Ok(p) => std::fs::write(dir.join(format!("{i:03}-{}.ptx", kernel.kind())), p.text)?,
                Err(e) => std::fs::write(dir.join(format!("{i:03}-{}.ptx-error", kernel.kind())), e.to_string())?,
            }
        }
        Ok(self.kernels.len())
    }
}

impl Executor for KernelRecorder {
    type Error = RuntimeError;

    fn error_kind(error: &RuntimeError) -> gt_ir::FailureKind {
        error.kind()
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        self.interp.execute(instr)?;
        // The interpreter accepted it, so the operands are typed and the type rule holds.
        let ty = |v: ValueId| self.types.get(&v).cloned().ok_or(gt_ir::TypeError::UnknownValue(v));
        if let Ok(results) = shape::infer(instr, &ty) {
            let ty = |v: ValueId| self.types[&v].clone();
            for step in lower(instr, &ty, &results) {
                // What a GPU stores each buffer as.
                let storage = step.storage(|v| self.types[&v].dtype, &results);
                let storage = |i: usize| storage[i].clone();
                let kernels = match step {
                    Step::Launch { kernel, .. } => vec![(kernel, storage(0))],
                    Step::TwoPass { first, second, .. } => vec![(first, storage(0)), (second, storage(1))],
                    Step::Upload { .. } => vec![],
                };
                for (kernel, storage) in kernels {
                    if self.seen.insert((kernel.clone(), storage.clone())) {
                        self.kernels.push(kernel);
                        self.storage.push(storage);
                    }
                }
            }
            if let Instr::Free { src } = instr {
                self.types.remove(src);
            }
            self.types.extend(instr.results().into_iter().zip(results));
        }
        Ok(())
    }

    fn execute_at(&mut self, instr: &Instr, _span: Option<Span>) -> Result<(), RuntimeError> {
        self.execute(instr)
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        self.interp.read(value)
    }
}
