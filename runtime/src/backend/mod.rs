//! Backends: where instructions execute. `cpu` holds the reference interpreter; `cuda` the
//! PTX generator (always built, so CI can assemble every kernel) and, with the `cuda`
//! feature, the GPU backend. [`Backend`] is what a worker drives.

pub mod checks;
pub mod cpu;
pub mod cuda;

use crate::{Interpreter, RuntimeError};
use gt_ir::data::Elements;
use gt_ir::kernel::Precision;
use gt_ir::{HostTensor, Instr, TensorType, ValueId};
use std::fmt;
use std::str::FromStr;

/// What a worker executes its stream on.
pub trait Backend {
    /// The backend's name in stats and registration (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Runs one instruction (a backend may only queue it; [`Backend::finish`] waits).
    fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError>;
    /// Runs `instr` knowing that its operands in `dying` are freed right after it (by the
    /// frees that follow it in its batch): a backend may then write the result over one of
    /// them instead of into new memory, as PyTorch's in-place ops and JAX's donated buffers
    /// do, and return it; that value is gone and its free has nothing left to do. The default
    /// runs `instr` as [`Backend::execute`] does and takes nothing.
    fn execute_donating(&mut self, instr: &Instr, _dying: &[ValueId]) -> Result<Option<ValueId>, RuntimeError> {
        self.execute(instr).map(|()| None)
    }
    /// A value's type and row-major data (waits for the work that computes it).
    fn read(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError>;
    /// Hands a stored value's type and row-major little-endian bytes to `f` where they lie,
    /// without a copy (a read written straight into a client's shared answer file); `false`
    /// (nothing done) from a backend, or for a value, that cannot: the caller reads it.
    fn with_bytes(&mut self, _value: ValueId, _f: &mut dyn FnMut(TensorType, &[u8])) -> bool {
        false
    }
    /// A value's type and row-major data, its buffer handed over without a copy and the value
    /// freed; `None` from a backend that cannot (the caller reads the value instead, and frees
    /// it as usual).
    fn take(&mut self, _value: ValueId) -> Option<Result<HostTensor, RuntimeError>> {
        None
    }
    /// Defines `dst` as `data` of type `ty`, as the `literal` instruction would (a backend
    /// that can take the data without copying it overrides this).
    fn write(&mut self, dst: ValueId, ty: TensorType, data: Elements) -> Result<(), RuntimeError> {
        self.execute(&Instr::Literal { dst, ty, data })
    }
    /// Waits for every queued instruction, reporting a failure found while they ran.
    fn finish(&mut self) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Asks the backend to time the instructions it runs from now on with its own clock
    /// (a GPU's events: when the device ran them, not when they were queued), reported in
    /// nanoseconds since `epoch` by [`Backend::take_timings`]. Host backends keep no times
    /// of their own: the worker's clock around `execute` is theirs.
    fn start_timing(&mut self, _epoch: std::time::Instant) {}
    /// After [`Backend::finish`]: the device times of the instructions run since
    /// [`Backend::start_timing`], in order (their `index` is filled in by the caller);
    /// `None` when the backend keeps none.
    fn take_timings(&mut self) -> Option<Vec<gt_transport::message::Timing>> {
        None
    }
    /// Values defined and not freed.
    fn live_values(&self) -> usize;
    /// Bytes of data the live values hold.
    fn live_bytes(&self) -> usize;
    /// The most bytes the live values held at once.
    fn peak_bytes(&self) -> usize;
}

/// A backend's bytes in live values, and the most it held at once: a result is counted
/// before the value it replaces is let go, as both exist at that moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Residency {
    live: usize,
    peak: usize,
}

impl Residency {
    /// A value of `bytes` was made.
    pub fn add(&mut self, bytes: usize) {
        self.live += bytes;
        self.peak = self.peak.max(self.live);
    }

    /// A value of `bytes` was let go.
    pub fn remove(&mut self, bytes: usize) {
        self.live = self.live.saturating_sub(bytes);
    }

    /// Bytes held now.
    pub fn live(&self) -> usize {
        self.live
    }

    /// The most bytes held at once.
    pub fn peak(&self) -> usize {
        self.peak
    }
}

impl Backend for Interpreter {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        Interpreter::execute(self, instr)
    }

    fn execute_donating(&mut self, instr: &Instr, dying: &[ValueId]) -> Result<Option<ValueId>, RuntimeError> {
        Interpreter::execute_donating(self, instr, dying)
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        Interpreter::read(self, value)
    }

    fn with_bytes(&mut self, value: ValueId, f: &mut dyn FnMut(TensorType, &[u8])) -> bool {
        Interpreter::with_bytes(self, value, f)
    }

    fn write(&mut self, dst: ValueId, ty: TensorType, data: Elements) -> Result<(), RuntimeError> {
        Interpreter::write(self, dst, ty, data)
    }

    fn take(&mut self, value: ValueId) -> Option<Result<HostTensor, RuntimeError>> {
        Some(Interpreter::take(self, value))
    }

    fn live_values(&self) -> usize {
        Interpreter::live_values(self)
    }

    fn live_bytes(&self) -> usize {
        Interpreter::live_bytes(self)
    }

    fn peak_bytes(&self) -> usize {
        Interpreter::peak_bytes(self)
    }
}

/// Which backend a worker uses (`--backend`, `GT_BACKEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// The reference interpreter.
    #[default]
    Cpu,
    /// An NVIDIA GPU through generated PTX (needs the `cuda` feature).
    Cuda,
}

impl BackendKind {
    /// Every kind, in help order.
    pub const ALL: [BackendKind; 2] = [BackendKind::Cpu, BackendKind::Cuda];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Starts a backend of this kind on the calling thread (a CUDA context is per thread).
    /// `precision` is how a GPU multiplies matrices (the CPU always uses f32); `jit` runs
    /// the CPU's `fused` kernels as machine code (else on the kernel oracle).
    pub fn start(
        self,
        max_tensor_bytes: usize,
        memory_budget: usize,
        precision: Precision,
        jit: bool,
    ) -> Result<Box<dyn Backend>, BackendError> {
        let _ = precision;
        match self {
            BackendKind::Cpu => {
                let interp = Interpreter::with_max_tensor_bytes(max_tensor_bytes).with_memory_budget(memory_budget);
                Ok(Box::new(if jit { interp.with_jit() } else { interp }))
            }
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let mut b = cuda::CudaBackend::new(0, max_tensor_bytes)?;
                b.set_matmul_precision(precision);
                Ok(Box::new(b))
            }
            #[cfg(not(feature = "cuda"))]
            BackendKind::Cuda => Err(BackendError::NotBuilt),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend name that names no backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{name}` (known: {})", BackendKind::ALL.map(BackendKind::name).join(", "))]
pub struct UnknownBackend {
    /// The name given.
    pub name: String,
}

impl FromStr for BackendKind {
    type Err = UnknownBackend;

    fn from_str(s: &str) -> Result<BackendKind, UnknownBackend> {
        BackendKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| UnknownBackend { name: s.to_string() })
    }
}

/// Why a backend could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// This build has no CUDA support.
    #[error("this gt was built without CUDA support (rebuild with `--features cuda`)")]
    NotBuilt,
    /// The driver or device could not be used.
    #[error("CUDA is not available: {0}")]
    Unavailable(CudaUnavailable),
}

/// Why the CUDA driver or device could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaUnavailable {
    /// A driver call failed while starting.
    #[error("{step}: {driver_message}")]
    Driver {
        /// What was being done.
        step: CudaStartStep,
        /// The driver's own description of its error code (text from outside gt).
        driver_message: String,
    },
    /// No device with that ordinal.
    #[error("no CUDA device {ordinal} (this machine has {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
    /// A device older than the generated code needs.
    #[error("device {ordinal} has compute capability {major}.x; gt's kernels need 8.0 (Ampere) or newer")]
    ComputeCapability {
        /// The device.
        ordinal: u32,
        /// Its major compute capability.
        major: i32,
    },
}

/// What the CUDA backend was doing when the driver failed it at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CudaStartStep {
    /// `cuInit`.
    #[error("the driver did not initialise")]
    Init,
    /// Counting devices.
    #[error("counting devices failed")]
    CountDevices,
    /// Opening the device.
    #[error("opening the device failed")]
    OpenDevice,
    /// Creating a context.
    #[error("creating a context failed")]
    CreateContext,
    /// Creating a stream.
    #[error("creating a stream failed")]
    CreateStream,
}
