//! The CPU JIT: kernels of the kernel IR ([`gt_ir::kernel`]) compiled to machine code by
//! Cranelift and run on host buffers. [`Jit::run`] computes what the oracle
//! ([`super::kernels::run`]) computes, many times faster: a fused map is one pass over
//! memory, vectorised four lanes wide, where the interpreter materialises every node.
//!
//! - Map kernels (plain, with in-row reductions, or ending in a reduction) become one
//!   function each (`codegen.rs`; the loop structure is documented there), except plain
//!   maps with costly ops (`exp`, `tanh`, ...) read whole or broadcast: those run tile by
//!   tile through `vmath`'s 8-lane functions (`tiles.rs`), faster than Cranelift's 4 lanes,
//!   with the same bits and nothing to compile.
//! - Matmul kernels run `matrixmultiply::sgemm` per batch index into the contiguous
//!   output, then a compiled map applies the epilogue in place. `Precision::Tf32` is f32
//!   here (the oracle's products).
//! - Compiled code is cached by the kernel value itself (shapes, strides and expression
//!   are constants in the code). The cache is bounded ([`MAX_CACHED_KERNELS`],
//!   [`MAX_CODE_BYTES`]) and evicts the least recently used code by generations, since
//!   Cranelift frees code only a [`JITModule`] at a time: new code goes into the current
//!   module; when it holds half the bounds it becomes the previous one and a new module
//!   starts, freeing the module before it. A kernel used while in the previous module is
//!   compiled again into the current one, so what is freed is exactly the code nobody ran
//!   for a whole generation: a stream of ever-new kernels, or the kernels of clients long
//!   gone, cannot grow a worker without limit, and the kernels in use survive.
//!
//! # Numerics
//!
//! Bit-for-bit the oracle: `add sub mul div sqrt rsqrt neg abs relu maximum minimum`,
//! comparisons, `where`, `iota`, `rand`, `randn`, `pow` (the same `powf`), and matmul
//! products (the same `sgemm`). Within 2 ulp (relative error < 2.4e-7 on normal
//! results; see `math.rs`): `exp log tanh sigmoid`, which are polynomial approximations
//! evaluated in SIMD lanes rather than libm calls. Sums and means accumulate in `f64` like
//! the oracle, in another order, so they usually round to the same `f32` and otherwise
//! differ by an ulp; max/min are exact (NaN propagates; which zero wins a tie between
//! `-0` and `+0` may differ). Empty rows give the oracle's values (sum 0, mean NaN, max
//! `-inf`, min `+inf`).
//!
//! # Safety
//!
//! Generated code does no bounds checks of its own. [`Jit::run`] calls
//! [`Kernel::check_bounds`] with the real buffer lengths before every call, and the code
//! only touches elements that check covers (empty loops touch nothing), so no call reads
//! or writes outside the slices it is given. Everything `unsafe` is in this file.

mod codegen;
mod math;
#[cfg(test)]
mod tests;
mod tiles;
mod wide;

pub(crate) use tiles::eager as eager_by_tiles;
pub use tiles::{Stored, StoredMut};

use super::threads::Sgemm;
use codegen::{epilogue_map, map_function, Shim, Target};
use cranelift_codegen::ir::UserFuncName;
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};
use foldhash::{HashMap, HashMapExt};
use gt_ir::data::Elements;
use gt_ir::kernel::{validate, BufferStorage, Kernel, KernelError, MapKernel, MatMulKernel, Node, Storage};
use gt_ir::random;
use std::fmt;
use std::mem::ManuallyDrop;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

/// Why a kernel could not be compiled or run.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    /// Cranelift refused one of the JIT's settings on this host.
    #[error("jit: unsupported host: {name}={value}: {source}")]
    Setting {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: &'static str,
        /// Why.
        #[source]
        source: cranelift_codegen::settings::SetError,
    },
    /// Cranelift has no backend for the host.
    #[error("jit: unsupported host: {reason}")]
    NoBackend {
        /// Cranelift's reason (`unsupported architecture`, ...).
        reason: &'static str,
    },
    /// The host's backend refused the settings.
    #[error("jit: unsupported host: {0}")]
    Isa(#[source] Box<cranelift_codegen::CodegenError>),
    /// A malformed kernel (see [`gt_ir::kernel::validate`]).
    #[error("jit: malformed kernel: {0}")]
    Invalid(#[source] KernelError),
    /// A kernel computing in something other than `f32`, or rounding through another dtype
    /// mid-expression, given to the `f32` entry points ([`Jit::run_wide`] takes the first).
    #[error("jit: not a plain `f32` kernel (it computes in {compute} or has `round` nodes)")]
    Compute {
        /// What the kernel computes in.
        compute: gt_ir::kernel::Compute,
    },
    /// The buffers do not fit the kernel (or the kernel is malformed).
    #[error("jit: {0}")]
    Bounds(#[source] KernelError),
    /// Cranelift refused the generated code: a bug in the generator. (`Debug`, because the
    /// `Display` of a compilation error leaves out the verifier's findings.)
    #[error("jit: code generation failed: {0:?}")]
    Module(#[source] Box<cranelift_module::ModuleError>),
    /// A runtime shim declared under another function id than the generated code imports
    /// it by (`codegen::Shim`): a bug in the JIT.
    #[error("jit: code generation failed: shim {symbol} got function id {id}, expected {expected}")]
    ShimId {
        /// The shim's symbol.
        symbol: &'static str,
        /// The id it got.
        id: u32,
        /// The id the code imports.
        expected: u32,
    },
    /// The cache holds another kind of code for the kernel: a bug in the JIT.
    #[error("jit: code generation failed: cached code of another kind of kernel")]
    CachedKind,
}

/// Most kernels kept compiled at once (two generations of half as many).
pub const MAX_CACHED_KERNELS: usize = 4096;
/// Most bytes of machine code kept at once (two generations of about half as many).
pub const MAX_CODE_BYTES: usize = 64 << 20;

/// Counters of the compile cache.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JitStats {
    /// Kernels compiled.
    pub compiled: u64,
    /// Times a generation of code nobody ran since it was current was freed.
    pub evictions: u64,
    /// Kernels compiled now.
    pub cached: u64,
    /// Bytes of their machine code.
    pub code_bytes: u64,
    /// Lookups that found the kernel compiled already.
    pub cache_hits: u64,
    /// Total time spent compiling.
    pub compile_time: Duration,
}

/// A compiled map: `f(inputs, out)` with `inputs` pointing at one base pointer per input.
type KernelFn = unsafe extern "C" fn(*const *const f32, *mut f32);

/// The code of one kernel.
#[derive(Debug, Clone, Copy)]
enum Compiled {
    Map(KernelFn),
    /// The epilogue map, if any.
    MatMul(Option<KernelFn>),
    /// An `f64` or integer map over buffers stored as its key says ([`storage_key`]).
    Wide(u128, KernelFn),
}

/// The cache key of `kernel` over buffers stored as `storage` where [`Jit::run_wide`]
/// compiles it ([`Jit::compiles_wide`]), else `None`.
fn wide_key(kernel: &Kernel, storage: &BufferStorage) -> Option<u128> {
    let Kernel::Map(m) = kernel else { return None };
    let compiled = m.compute != gt_ir::kernel::Compute::F32 && codegen::compiles(m, storage);
    compiled.then(|| storage_key(storage)).flatten()
}

/// An exact key of the storage of an `f64` or integer kernel's buffers (3 bits each, the
/// output first), or `None` when there are more than 42 buffers or one of another dtype
/// (such a kernel is not compiled).
fn storage_key(storage: &BufferStorage) -> Option<u128> {
    let mut key = 0u128;
    for (i, s) in [storage.output].iter().chain(&storage.inputs).enumerate() {
        let code = match s {
            Storage::F64 => 1,
            Storage::I64 => 2,
            Storage::I32 => 3,
            Storage::Bool => 4,
            _ => return None,
        };
        if i >= 42 {
            return None;
        }
        key |= code << (3 * i);
    }
    Some(key)
}

/// The buffers of an `f64` or integer kernel ([`Jit::run_wide`]).
#[derive(Debug, Clone, Copy)]
pub enum Wide<'a> {
    /// `f64` elements.
    F64(&'a [f64]),
    /// `i64` elements.
    I64(&'a [i64]),
    /// `i32` elements.
    I32(&'a [i32]),
    /// `bool` elements (one byte, 0 or 1).
    Bool(&'a [bool]),
}

impl Wide<'_> {
    /// How its elements are stored.
    pub fn storage(&self) -> Storage {
        self.parts().0
    }

    fn parts(&self) -> (Storage, *const f32, usize) {
        match *self {
            Wide::F64(b) => (Storage::F64, b.as_ptr().cast(), b.len()),
            Wide::I64(b) => (Storage::I64, b.as_ptr().cast(), b.len()),
            Wide::I32(b) => (Storage::I32, b.as_ptr().cast(), b.len()),
            Wide::Bool(b) => (Storage::Bool, b.as_ptr().cast(), b.len()),
        }
    }
}

/// A vector of `len` elements of `T` written by `write` (given where they go), which writes
/// each of them when `covers` (the kernel covers its output exactly) and returns `Ok`; zeros
/// first otherwise, and zeros after a cancelled kernel stopped early (the worker discards
/// that result, but its memory must hold values).
#[allow(unsafe_code)]
fn written<T>(
    len: usize,
    covers: bool,
    write: impl FnOnce(*mut f32) -> Result<Duration, JitError>,
) -> Result<(Vec<T>, Duration), JitError> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    let at = v.as_mut_ptr();
    if !covers {
        // SAFETY: `at` is valid for `len` elements (the capacity); all-zero bytes are a
        // value of every `T` this is called with (`f64`, `i64`, `i32`, `bool`).
        unsafe { std::ptr::write_bytes(at, 0, len) };
    }
    let took = write(at.cast())?;
    if crate::cancel::Token::current().stop() {
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(at, 0, len) };
    }
    // SAFETY: each of the `len` elements was written: zeros above, or by the kernel, which
    // covers the output exactly and ran to its end (it returned `Ok` and was not cancelled).
    unsafe { v.set_len(len) };
    Ok((v, took))
}

/// What a kernel run by tiles is checked for first, as compiled code is when it compiles:
/// its accesses within buffers of `lens` elements and a result of `out_len`
/// ([`Kernel::check_bounds`]), and its nodes well formed.
fn checked_for_tiles(kernel: &Kernel, lens: &[usize], out_len: usize) -> Result<(), JitError> {
    kernel.check_bounds(lens, out_len).map_err(JitError::Bounds)?;
    validate(kernel).map_err(JitError::Invalid)
}

/// The `len` elements at `at` as a slice of `T`s not yet written.
///
/// # Safety
/// `at` is valid, and aligned, for `len` elements of `T`, which nothing else touches while
/// the slice lives.
#[allow(unsafe_code)]
unsafe fn slice_at<'a, T>(at: *mut f32, len: usize) -> &'a mut [MaybeUninit<T>] {
    // SAFETY: the caller's.
    unsafe { std::slice::from_raw_parts_mut(at.cast::<MaybeUninit<T>>(), len) }
}

/// Compiles kernels on first sight and runs them; see the module docs.
pub struct Jit {
    /// The current generation, where new code goes. Taken only by `drop` and by
    /// [`Jit::next_generation`], which free the code with it.
    module: ManuallyDrop<JITModule>,
    /// The generation before, freed when the current one fills.
    previous: Option<JITModule>,
    isa: cranelift_codegen::isa::OwnedTargetIsa,
    target: Target,
    /// Every kernel's code and the generation holding it (the current one or the one before).
    cache: HashMap<Kernel, (Compiled, u64)>,
    /// The current generation's number.
    generation: u64,
    /// Kernels compiled into the current generation, and its bytes of code; the previous
    /// generation's bytes.
    current: (usize, u64),
    previous_bytes: u64,
    stats: JitStats,
    /// Whether plain maps with costly ops run by tiles (`tiles.rs`) instead of compiled.
    tiles: bool,
}

impl fmt::Debug for Jit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jit").field("cached", &self.cache.len()).field("stats", &self.stats).finish()
    }
}

extern "C" fn gt_jit_uniform(seed: u64, i: u64) -> f32 {
    random::uniform(seed, i)
}

extern "C" fn gt_jit_normal(seed: u64, i: u64) -> f32 {
    random::normal(seed, i)
}

extern "C" fn gt_jit_powf(x: f32, y: f32) -> f32 {
    x.powf(y)
}

// Cranelift's libcalls for `f64` instructions a CPU may lack (`fma` without FMA, `nearest`,
// `floor` and `trunc` without SSE4.1), given Rust's exact functions by name rather than
// looked up in the process's symbols.
extern "C" fn gt_jit_fma(a: f64, b: f64, c: f64) -> f64 {
    a.mul_add(b, c)
}

extern "C" fn gt_jit_nearest(x: f64) -> f64 {
    x.round_ties_even()
}

extern "C" fn gt_jit_floor(x: f64) -> f64 {
    x.floor()
}

extern "C" fn gt_jit_trunc(x: f64) -> f64 {
    x.trunc()
}

/// The libcalls [`gt_jit_fma`] and the others stand for, by the names Cranelift's default
/// libcall names give them.
const LIBCALLS: [(&str, *const u8); 4] = [
    ("fma", gt_jit_fma as extern "C" fn(f64, f64, f64) -> f64 as *const u8),
    ("nearbyint", gt_jit_nearest as extern "C" fn(f64) -> f64 as *const u8),
    ("floor", gt_jit_floor as extern "C" fn(f64) -> f64 as *const u8),
    ("trunc", gt_jit_trunc as extern "C" fn(f64) -> f64 as *const u8),
];

fn shim_address(shim: Shim) -> *const u8 {
    match shim {
        Shim::Uniform => gt_jit_uniform as extern "C" fn(u64, u64) -> f32 as *const u8,
        Shim::Normal => gt_jit_normal as extern "C" fn(u64, u64) -> f32 as *const u8,
        Shim::Powf => gt_jit_powf as extern "C" fn(f32, f32) -> f32 as *const u8,
        Shim::BinaryF64 => wide::binary_f64 as extern "C" fn(i64, f64, f64) -> f64 as *const u8,
        Shim::UnaryI64 => wide::unary_i64 as extern "C" fn(i64, i64) -> i64 as *const u8,
        Shim::BinaryI64 => wide::binary_i64 as extern "C" fn(i64, i64, i64) -> i64 as *const u8,
    }
}

impl Jit {
    /// A JIT for the host CPU (`opt_level=speed`; the CLIF verifier on in debug builds).
    pub fn new() -> Result<Jit, JitError> {
        Jit::without(&[])
    }

    /// A JIT for the host CPU with the ISA features named (`has_fma`...) turned off: for
    /// tests of the code older CPUs get.
    fn without(features: &[&'static str]) -> Result<Jit, JitError> {
        let mut flags = settings::builder();
        let verify = if cfg!(debug_assertions) { "true" } else { "false" };
        for (name, value) in [
            ("opt_level", "speed"),
            ("is_pic", "false"),
            ("use_colocated_libcalls", "false"),
            ("enable_verifier", verify),
        ] {
            flags.set(name, value).map_err(|source| JitError::Setting { name, value, source })?;
        }
        let mut isa = cranelift_native::builder().map_err(|reason| JitError::NoBackend { reason })?;
        for &name in features {
            isa.set(name, "false").map_err(|source| JitError::Setting { name, value: "false", source })?;
        }
        let isa = isa.finish(settings::Flags::new(flags)).map_err(|e| JitError::Isa(Box::new(e)))?;
        let fma = isa.isa_flags().iter().any(|f| f.name == "has_fma" && f.as_bool() == Some(true));
        let target = Target { frontend: isa.frontend_config(), fma };
        let module = module_for(isa.clone(), target)?;
        Ok(Jit {
            module: ManuallyDrop::new(module),
            previous: None,
            isa,
            target,
            cache: HashMap::new(),
            generation: 0,
            current: (0, 0),
            previous_bytes: 0,
            stats: JitStats::default(),
            tiles: true,
        })
    }

    /// This JIT compiling every kernel, plain maps with costly ops too (which it otherwise
    /// runs by tiles, `tiles.rs`): for tests of the generated code.
    pub fn compiling_all(mut self) -> Jit {
        self.tiles = false;
        self
    }

    /// Starts a new generation (the current one is full): the current module becomes the
    /// previous one, and the module before it is freed with every kernel still in it.
    #[allow(unsafe_code)]
    fn next_generation(&mut self) -> Result<(), JitError> {
        let fresh = module_for(self.isa.clone(), self.target)?;
        // SAFETY: the taken module is replaced at once and kept as the previous generation.
        let full = unsafe { ManuallyDrop::take(&mut self.module) };
        self.module = ManuallyDrop::new(fresh);
        let current = self.generation;
        if let Some(old) = self.previous.replace(full) {
            self.cache.retain(|_, (_, g)| *g == current);
            // SAFETY: every pointer into the old module's code was in a cache entry of its
            // generation, all removed just above, and no compiled function is running
            // (`compile` borrows `self` mutably).
            unsafe { old.free_memory() };
            self.stats.evictions += 1;
        }
        self.generation += 1;
        self.previous_bytes = self.current.1;
        self.current = (0, 0);
        Ok(())
    }

    /// Checks bounds ([`Kernel::check_bounds`]), compiles on first sight (cached by the
    /// kernel value), runs: `inputs` one buffer per kernel input, results into `out`.
    /// Returns the time spent compiling (zero when the kernel was cached).
    #[allow(unsafe_code)]
    pub fn run(&mut self, kernel: &Kernel, inputs: &[&[f32]], out: &mut [f32]) -> Result<Duration, JitError> {
        if self.tiled(kernel, false).is_some() {
            let stored: Vec<Stored> = inputs.iter().map(|b| Stored::F32(b)).collect();
            return self.run_stored(kernel, &stored, StoredMut::F32(out));
        }
        // SAFETY: `out` is a live exclusive slice of `out.len()` elements.
        unsafe { self.run_compiled(kernel, inputs, out.as_mut_ptr(), out.len()) }
    }

    /// [`Jit::run_stored`] into an `f32` result not yet written, which the kernel writes without
    /// a pass of zeros before it (as much memory traffic as an elementwise op, for a large
    /// result): plain maps and products covering `out` exactly ([`Kernel::check_covers`]), by
    /// tiles or compiled. Kernels with rows or a reduction, or that do not cover `out`, get it
    /// zeroed first. Every element of `out` is written when this returns `Ok` (zeros where a
    /// cancelled kernel stopped early).
    #[allow(unsafe_code)]
    pub fn run_uninit(
        &mut self,
        kernel: &Kernel,
        inputs: &[Stored],
        out: &mut [MaybeUninit<f32>],
    ) -> Result<Duration, JitError> {
        let writes_each_once = match kernel {
            Kernel::Map(m) => m.rows.is_empty() && m.reduce.is_none(),
            Kernel::MatMul(_) => true,
        } && kernel.check_covers(out.len()).is_ok();
        if !writes_each_once {
            return self.run_stored(kernel, inputs, StoredMut::F32(super::threads::zeroed(out)));
        }
        let token = crate::cancel::Token::current();
        let converts = inputs.iter().any(|b| !matches!(b, Stored::F32(_)));
        let took = if let Some(m) = self.tiled(kernel, converts) {
            let lens: Vec<usize> = inputs.iter().map(Stored::len).collect();
            checked_for_tiles(kernel, &lens, out.len())?;
            tiles::run_uninit(m, inputs, out, &|| token.stop());
            Duration::ZERO
        } else {
            let widened: Vec<std::borrow::Cow<[f32]>> = inputs.iter().map(Stored::widened).collect();
            let refs: Vec<&[f32]> = widened.iter().map(|b| &b[..]).collect();
            // SAFETY: `out` is a live exclusive slice of `out.len()` elements; the compiled code
            // only writes them.
            unsafe { self.run_compiled(kernel, &refs, out.as_mut_ptr().cast::<f32>(), out.len())? }
        };
        // The kernel covers `out` (checked above) unless it stopped early when cancelled: what
        // it left is written now (the worker discards the result; its memory must hold values).
        if token.stop() {
            out.fill(MaybeUninit::new(0.0));
        }
        Ok(took)
    }

    /// [`Jit::run`] of a kernel not run by tiles, into `out_len` elements at `out`.
    ///
    /// # Safety
    /// `out` is valid for writes of `out_len` elements, and nothing else reads or writes them
    /// meanwhile. They need not be initialized: a kernel writes its output and reads none of it,
    /// but a product's epilogue, which reads the product it rewrites after `sgemm` wrote it.
    #[allow(unsafe_code)]
    unsafe fn run_compiled(
        &mut self,
        kernel: &Kernel,
        inputs: &[&[f32]],
        out: *mut f32,
        out_len: usize,
    ) -> Result<Duration, JitError> {
        let lens: Vec<usize> = inputs.iter().map(|b| b.len()).collect();
        let k = match kernel {
            Kernel::Map(m) => {
                let ptrs: Vec<*const f32> = inputs.iter().map(|b| b.as_ptr()).collect();
                // SAFETY: the caller's; `out` is no input's buffer.
                return unsafe { self.run_map(kernel, m, (&lens, &ptrs), out, out_len) };
            }
            Kernel::MatMul(k) => k,
        };
        kernel.check_bounds(&lens, out_len).map_err(JitError::Bounds)?;
        // Nothing to write (covered exactly: `check_covers`), so nothing to compute.
        if out_len == 0 {
            return Ok(Duration::ZERO);
        }
        // A large product's epilogue runs split too (the product itself always is).
        if let Some(parts) = epilogue_map(k).filter(splits).map(|m| split_outer(&m)) {
            // SAFETY: the caller's, and the bounds just checked.
            if let Some(took) = unsafe { self.run_split_epilogue(k, &parts, inputs, out, out_len)? } {
                return Ok(took);
            }
        }
        let (compiled, took) = self.compiled(kernel)?;
        let Compiled::MatMul(epilogue) = compiled else { return Err(JitError::CachedKind) };
        // SAFETY: the caller's, and the bounds just checked.
        unsafe { matmul(k, inputs, out, epilogue) };
        Ok(took)
    }

    /// Map kernel `kernel` (`m`) over inputs given as lengths and pointers, into `out_len`
    /// elements at `out`: bounds checked, split over the worker's threads when large,
    /// compiled on first sight.
    ///
    /// # Safety
    /// Each pointer is valid for reads of its length and `out` for writes of `out_len`
    /// elements, which nothing else touches meanwhile; `out` may be an input's buffer only
    /// where that input is read exactly where the kernel writes ([`Jit::run_over`]).
    #[allow(unsafe_code)]
    unsafe fn run_map(
        &mut self,
        kernel: &Kernel,
        m: &MapKernel,
        (lens, ptrs): (&[usize], &[*const f32]),
        out: *mut f32,
        out_len: usize,
    ) -> Result<Duration, JitError> {
        kernel.check_bounds(lens, out_len).map_err(JitError::Bounds)?;
        // Nothing to write (covered exactly: `check_covers`), so nothing to compute; the
        // loops of an empty space's other axes could still run for hours (`f32[2^40, 0]`).
        if out_len == 0 {
            return Ok(Duration::ZERO);
        }
        // Split only when it would be: `split_outer` copies the kernel.
        if splits(m) {
            if let Some(took) = self.run_parts(&split_outer(m), (lens, ptrs), out, out_len)? {
                return Ok(took);
            }
        }
        let (compiled, took) = self.compiled(kernel)?;
        let Compiled::Map(f) = compiled else { return Err(JitError::CachedKind) };
        call(f, ptrs, out, &crate::cancel::Token::current());
        Ok(took)
    }

    /// Runs an `f64` or integer map kernel (`Compute::F64`/`I64`) over `inputs` into a new
    /// result of `out_len` elements stored as `output`, bit for bit what the oracle computes
    /// ([`super::kernels::run_values`]): bounds checked, split over the worker's threads when
    /// large, compiled on first sight, the result written without zeros first where the
    /// kernel covers it. `None` for a kernel [`Jit::compiles_wide`] refuses over these
    /// buffers (the oracle runs it), found before anything is allocated.
    pub fn run_wide(
        &mut self,
        kernel: &Kernel,
        inputs: &[Wide],
        output: Storage,
        out_len: usize,
    ) -> Result<Option<(Elements, Duration)>, JitError> {
        let parts: Vec<(Storage, *const f32, usize)> = inputs.iter().map(Wide::parts).collect();
        let storage = BufferStorage { output, inputs: parts.iter().map(|p| p.0).collect() };
        let covers = kernel.check_covers(out_len).is_ok();
        if let Some(m) = self.tiled_f64(kernel, &storage) {
            let lens: Vec<usize> = parts.iter().map(|p| p.2).collect();
            checked_for_tiles(kernel, &lens, out_len)?;
            let token = crate::cancel::Token::current();
            let stop = || token.stop();
            // SAFETY (both): `written` hands over room for `out_len` elements of the type
            // asked for, which nothing else touches; the tiles only write them.
            #[allow(unsafe_code)]
            let run = |at: *mut f32| unsafe {
                match output {
                    Storage::F64 => tiles::run_f64(m, inputs, slice_at::<f64>(at, out_len), &stop),
                    _ => tiles::run_f64(m, inputs, slice_at::<bool>(at, out_len), &stop),
                }
                Ok(Duration::ZERO)
            };
            return Ok(Some(match output {
                Storage::F64 => written(out_len, covers, run).map(|(v, t)| (Elements::F64(v), t))?,
                // `applies_f64` takes no other output storage.
                _ => written(out_len, covers, run).map(|(v, t)| (Elements::Bool(v), t))?,
            }));
        }
        let Some(key) = wide_key(kernel, &storage) else { return Ok(None) };
        let run = |out: *mut f32| self.run_wide_into(kernel, &parts, (&storage, key), out, out_len);
        Ok(Some(match output {
            Storage::F64 => written(out_len, covers, run).map(|(v, t)| (Elements::F64(v), t))?,
            Storage::I64 => written(out_len, covers, run).map(|(v, t)| (Elements::I64(v), t))?,
            Storage::I32 => written(out_len, covers, run).map(|(v, t)| (Elements::I32(v), t))?,
            // `storage_key` takes no other output storage.
            _ => written(out_len, covers, run).map(|(v, t)| (Elements::Bool(v), t))?,
        }))
    }

    /// [`Jit::run_wide`] of a kernel it compiles over `parts` (stored as `storage`, cached
    /// under `key`) into `out_len` elements at `out_ptr`, which nothing else touches
    /// meanwhile.
    fn run_wide_into(
        &mut self,
        kernel: &Kernel,
        parts: &[(Storage, *const f32, usize)],
        (storage, key): (&BufferStorage, u128),
        out_ptr: *mut f32,
        out_len: usize,
    ) -> Result<Duration, JitError> {
        let Kernel::Map(m) = kernel else { return Err(JitError::CachedKind) };
        let lens: Vec<usize> = parts.iter().map(|p| p.2).collect();
        let ptrs: Vec<*const f32> = parts.iter().map(|p| p.1).collect();
        kernel.check_bounds(&lens, out_len).map_err(JitError::Bounds)?;
        // Nothing to write (covered exactly: `check_covers`), so nothing to compute.
        if out_len == 0 {
            return Ok(Duration::ZERO);
        }
        if splits(m) {
            if let Some((fns, took)) = self.compile_parts(&split_outer(m), &lens, out_len, Some((storage, key)))? {
                run_compiled_parts(&fns, &ptrs, out_ptr);
                return Ok(took);
            }
        }
        let (compiled, took) = self.compiled_for(kernel, Some((storage, key)))?;
        let Compiled::Wide(_, f) = compiled else { return Err(JitError::CachedKind) };
        // The bounds were checked against these buffers; `out` is exclusively ours.
        call(f, &ptrs, out_ptr, &crate::cancel::Token::current());
        Ok(took)
    }

    /// Whether [`Jit::run_wide`] compiles `kernel` over buffers stored as `storage`: plain
    /// `f64` and `i64` maps over buffers of their own dtypes (`i64` kernels: `i64`, `i32`,
    /// `bool`), with `round` nodes through those; the oracle runs the others.
    pub fn compiles_wide(kernel: &Kernel, storage: &BufferStorage) -> bool {
        wide_key(kernel, storage).is_some()
    }

    /// [`Jit::run`] over buffers of any storage kernels take: a kernel that runs by tiles
    /// widens and rounds a tile at a time; compiled code reads and writes `f32`, so halves
    /// are widened whole first and its result rounded after.
    pub fn run_stored(&mut self, kernel: &Kernel, inputs: &[Stored], out: StoredMut) -> Result<Duration, JitError> {
        let converts = !matches!(out, StoredMut::F32(_)) || inputs.iter().any(|b| !matches!(b, Stored::F32(_)));
        if let Some(m) = self.tiled(kernel, converts) {
            let lens: Vec<usize> = inputs.iter().map(Stored::len).collect();
            checked_for_tiles(kernel, &lens, out.len())?;
            let token = crate::cancel::Token::current();
            tiles::run(m, inputs, out, &|| token.stop());
            return Ok(Duration::ZERO);
        }
        let widened: Vec<std::borrow::Cow<[f32]>> = inputs.iter().map(Stored::widened).collect();
        let refs: Vec<&[f32]> = widened.iter().map(|b| &b[..]).collect();
        match out {
            StoredMut::F32(out) => self.run(kernel, &refs, out),
            StoredMut::F16(out) => self.run_rounded(kernel, &refs, out),
            StoredMut::Bf16(out) => self.run_rounded(kernel, &refs, out),
            StoredMut::Bool(out) => self.run_rounded(kernel, &refs, out),
        }
    }

    /// [`Jit::run`] into an `f32` copy of `out`, then rounded into it.
    fn run_rounded<T: tiles::Store<f32>>(
        &mut self,
        kernel: &Kernel,
        inputs: &[&[f32]],
        out: &mut [T],
    ) -> Result<Duration, JitError> {
        let mut wide = vec![0.0f32; out.len()];
        let took = self.run(kernel, inputs, &mut wide)?;
        T::write(&wide, out);
        Ok(took)
    }

    /// `kernel` as an `f64` map this JIT runs by tiles over buffers stored as `storage`
    /// (`tiles.rs`), if it is one.
    fn tiled_f64<'k>(&self, kernel: &'k Kernel, storage: &BufferStorage) -> Option<&'k MapKernel> {
        match kernel {
            Kernel::Map(m) if self.tiles && tiles::applies_f64(m, storage) => Some(m),
            _ => None,
        }
    }

    /// `kernel` as a map this JIT runs by tiles (`tiles.rs`), if it is one; `converts`: some
    /// buffer holds halves or `bool`s.
    fn tiled<'k>(&self, kernel: &'k Kernel, converts: bool) -> Option<&'k MapKernel> {
        match kernel {
            Kernel::Map(m) if self.tiles && tiles::applies(m, converts) => Some(m),
            _ => None,
        }
    }

    /// Runs a map kernel as `parts` (ranges of its outer axis, [`split_outer`]) on the
    /// worker's threads, each compiled (and cached) as a kernel of its own and checked
    /// against the buffers; `None` if they could not all stay cached at once (the caller
    /// then runs the whole kernel).
    fn run_parts(
        &mut self,
        parts: &[Kernel],
        (lens, ptrs): (&[usize], &[*const f32]),
        out: *mut f32,
        out_len: usize,
    ) -> Result<Option<Duration>, JitError> {
        let Some((fns, took)) = self.compile_parts(parts, lens, out_len, None)? else { return Ok(None) };
        run_compiled_parts(&fns, ptrs, out);
        Ok(Some(took))
    }

    /// Runs a plain map (no rows, no reduction, not run by tiles) whose input `over` is read
    /// exactly where it writes (that input's offset and strides are its output's) with that
    /// input's buffer as its output: `data` holds the input and is rewritten with the result
    /// (the other entries of `inputs` are the other inputs; `inputs[over]` is not read). Each
    /// element is read before it is written, in the same iteration, so the result is the one
    /// a fresh output gets. `None`, having run nothing, for a kernel that does not qualify.
    /// Cancelled, it leaves `data` partly rewritten.
    #[allow(unsafe_code)]
    pub fn run_over(
        &mut self,
        kernel: &Kernel,
        inputs: &[&[f32]],
        over: usize,
        data: &mut [f32],
    ) -> Result<Option<Duration>, JitError> {
        let Kernel::Map(m) = kernel else { return Ok(None) };
        let in_step = m.inputs.get(over).is_some_and(|a| *a == m.output);
        let plain = m.rows.is_empty() && m.reduce.is_none() && self.tiled(kernel, false).is_none();
        if !in_step || !plain || inputs.len() != m.inputs.len() || kernel.check_covers(data.len()).is_err() {
            return Ok(None);
        }
        let (out, out_len) = (data.as_mut_ptr(), data.len());
        let mut lens: Vec<usize> = inputs.iter().map(|b| b.len()).collect();
        let mut ptrs: Vec<*const f32> = inputs.iter().map(|b| b.as_ptr()).collect();
        (lens[over], ptrs[over]) = (out_len, out.cast_const());
        // SAFETY: `data` is exclusively ours, and input `over`, which reads it, is read
        // exactly where the kernel writes (checked above).
        unsafe { self.run_map(kernel, m, (&lens, &ptrs), out, out_len) }.map(Some)
    }

    /// Runs product `k` and then its epilogue as `parts` (ranges of the product's outer
    /// axis, [`split_outer`] of its epilogue map) on the worker's threads, as [`Jit::run_parts`]
    /// runs a map; `None`, having run nothing, if the parts could not all stay cached at once.
    ///
    /// # Safety
    /// As [`Jit::run_compiled`]'s, with `k`'s bounds checked against `inputs` and `out_len`.
    #[allow(unsafe_code)]
    unsafe fn run_split_epilogue(
        &mut self,
        k: &MatMulKernel,
        parts: &[Kernel],
        inputs: &[&[f32]],
        out: *mut f32,
        out_len: usize,
    ) -> Result<Option<Duration>, JitError> {
        // The epilogue map's inputs: the epilogue's own, then the product, read in place.
        let mut lens: Vec<usize> = inputs[2..].iter().map(|b| b.len()).collect();
        lens.push(out_len);
        let Some((fns, took)) = self.compile_parts(parts, &lens, out_len, None)? else { return Ok(None) };
        // SAFETY: the caller's; no epilogue here, it runs below.
        unsafe { matmul(k, inputs, out, None) };
        // Each part rewrites its own rows of the product, reading only those (an epilogue
        // reads the product at the element it writes) and the inputs.
        let mut ptrs: Vec<*const f32> = inputs[2..].iter().map(|b| b.as_ptr()).collect();
        ptrs.push(out);
        run_compiled_parts(&fns, &ptrs, out);
        Ok(Some(took))
    }

    /// Checks `parts` (ranges of one map's outer axis) against buffers of `lens` and
    /// `out_len` and compiles them (`wide`: over buffers of that storage and key): their code
    /// and the compile time, or `None` if they could not all stay cached at once.
    fn compile_parts(
        &mut self,
        parts: &[Kernel],
        lens: &[usize],
        out_len: usize,
        wide: Option<(&BufferStorage, u128)>,
    ) -> Result<Option<(Vec<KernelFn>, Duration)>, JitError> {
        let mut took = Duration::ZERO;
        let generation = self.generation;
        let mut fns = Vec::with_capacity(parts.len());
        for p in parts {
            p.check_bounds(lens, out_len).map_err(JitError::Bounds)?;
            let (compiled, t) = self.compiled_for(p, wide)?;
            took += t;
            match compiled {
                Compiled::Map(f) | Compiled::Wide(_, f) => fns.push(f),
                Compiled::MatMul(_) => return Ok(None),
            }
        }
        // A compile that fills the cache keeps the generation before it: the parts compiled
        // first are gone only if the cache filled twice.
        Ok((self.generation <= generation + 1).then_some((fns, took)))
    }

    /// Compiles `kernel` into the cache without running it; the compile time (zero when it
    /// was cached).
    pub fn compile(&mut self, kernel: &Kernel) -> Result<Duration, JitError> {
        self.compiled(kernel).map(|(_, took)| took)
    }

    /// `kernel`'s code, compiled on first sight, and the time compiling took (zero when it
    /// was cached): one lookup of the kernel when it is. A kernel runs a few hundred
    /// nanoseconds after its lookup, so a second lookup (hashing and comparing the whole
    /// kernel again) was a large part of a small kernel's run.
    fn compiled(&mut self, kernel: &Kernel) -> Result<(Compiled, Duration), JitError> {
        self.compiled_for(kernel, None)
    }

    /// [`Jit::compiled`], for an `f64` or integer map over buffers of `wide`'s storage and
    /// key. The cache holds one storage per kernel: the same kernel over other buffers
    /// replaces it.
    fn compiled_for(
        &mut self,
        kernel: &Kernel,
        wide: Option<(&BufferStorage, u128)>,
    ) -> Result<(Compiled, Duration), JitError> {
        let fits = |c: &Compiled| match (c, wide) {
            (Compiled::Wide(key, _), Some((_, wanted))) => *key == wanted,
            (Compiled::Wide(..), None) | (_, Some(_)) => false,
            _ => true,
        };
        match self.cache.get(kernel) {
            Some(&(compiled, g)) if g == self.generation && fits(&compiled) => {
                self.stats.cache_hits += 1;
                return Ok((compiled, Duration::ZERO));
            }
            // In use while in the previous generation: compiled again into the current one,
            // so that it outlives the previous generation.
            Some((compiled, _)) if fits(compiled) => self.stats.cache_hits += 1,
            _ => validate(kernel).map_err(JitError::Invalid)?,
        }
        if self.current.0 >= MAX_CACHED_KERNELS / 2 || self.current.1 as usize >= MAX_CODE_BYTES / 2 {
            self.next_generation()?;
        }
        let start = Instant::now();
        let compiled = match (kernel, wide) {
            (Kernel::Map(k), None) => Compiled::Map(self.define(k, &BufferStorage::f32(k.inputs.len()))?),
            (Kernel::Map(k), Some((storage, key))) => Compiled::Wide(key, self.define(k, storage)?),
            (Kernel::MatMul(k), None) => Compiled::MatMul(
                epilogue_map(k).map(|m| self.define(&m, &BufferStorage::f32(m.inputs.len()))).transpose()?,
            ),
            (Kernel::MatMul(_), Some(_)) => return Err(JitError::CachedKind),
        };
        let took = start.elapsed();
        self.stats.compiled += 1;
        self.stats.compile_time += took;
        self.cache.insert(kernel.clone(), (compiled, self.generation));
        self.current.0 += 1;
        self.stats.cached = self.cache.len() as u64;
        self.stats.code_bytes = self.current.1 + self.previous_bytes;
        Ok((compiled, took))
    }

    /// Cache counters.
    pub fn stats(&self) -> JitStats {
        self.stats
    }

    /// Compiles one map over buffers stored as `storage` into the module and returns its
    /// entry point.
    #[allow(unsafe_code)]
    fn define(&mut self, k: &MapKernel, storage: &BufferStorage) -> Result<KernelFn, JitError> {
        // Checked before a function is declared: a refused kernel leaves the module as it was.
        if !codegen::compiles(k, storage) {
            return Err(JitError::Compute { compute: k.compute });
        }
        let id = self.module.declare_anonymous_function(&self.target.kernel_signature()).map_err(module_error)?;
        let mut ctx = self.module.make_context();
        ctx.func = map_function(k, storage, self.target, UserFuncName::user(0, id.as_u32()))?;
        self.module.define_function(id, &mut ctx).map_err(module_error)?;
        self.current.1 += ctx.compiled_code().map_or(0, |c| c.code_buffer().len()) as u64;
        self.module.clear_context(&mut ctx);
        self.module.finalize_definitions().map_err(module_error)?;
        let code = self.module.get_finalized_function(id);
        // SAFETY: `code` is the finalized (executable, freed only with the module, when the
        // cache that holds this pointer is cleared) entry of a function defined with `kernel_signature`, i.e.
        // `(ptr, ptr) -> ()` in the host's default calling convention, which is `extern "C"`.
        Ok(unsafe { std::mem::transmute::<*const u8, KernelFn>(code) })
    }
}

/// Cranelift's failure, boxed (it is large, and failures are rare).
fn module_error(e: cranelift_module::ModuleError) -> JitError {
    JitError::Module(Box::new(e))
}

/// A module for `isa` with the shims declared first and in order, so their function ids are
/// the user names the generated code imports them by (`codegen::Shim`).
fn module_for(isa: cranelift_codegen::isa::OwnedTargetIsa, target: Target) -> Result<JITModule, JitError> {
    let mut builder = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
    for shim in Shim::ALL {
        builder.symbol(shim.symbol(), shim_address(shim));
    }
    for (name, address) in LIBCALLS {
        builder.symbol(name, address);
    }
    let mut module = JITModule::new(builder);
    for shim in Shim::ALL {
        let id = module
            .declare_function(shim.symbol(), Linkage::Import, &shim.signature(target.frontend.default_call_conv))
            .map_err(module_error)?;
        if id.as_u32() != shim as u32 {
            return Err(JitError::ShimId { symbol: shim.symbol(), id: id.as_u32(), expected: shim as u32 });
        }
    }
    Ok(module)
}

impl Drop for Jit {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and the module is taken for good only here
        // (`next_generation` puts a fresh one in its place).
        let module = unsafe { ManuallyDrop::take(&mut self.module) };
        // SAFETY: every pointer into the code of either generation is in `self.cache`, which
        // is dropped with `self`, and no compiled function is running: `run` borrows `self`
        // mutably.
        unsafe { module.free_memory() };
        if let Some(previous) = self.previous.take() {
            // SAFETY: as above.
            unsafe { previous.free_memory() };
        }
    }
}

/// Calls a compiled map, which stops early once `token`'s instruction is cancelled.
#[allow(unsafe_code)]
fn call(f: KernelFn, inputs: &[*const f32], out: *mut f32, token: &crate::cancel::Token) {
    let (word, mine) = token.flag();
    // The cancel word and number travel after the inputs, as the generated code reads them.
    let mut args = Vec::with_capacity(inputs.len() + 2);
    args.extend_from_slice(inputs);
    args.extend([word.cast::<f32>(), mine as usize as *const f32]);
    // SAFETY: the caller checked the kernel's bounds against these buffers (each input
    // pointer is its slice's start, `out` the exclusive output slice's start), and the code
    // reads and writes only elements inside those bounds; it keeps no pointer after
    // returning. The cancel word lives as long as the token holds its watch.
    unsafe { f(args.as_ptr(), out) }
}

/// Runs compiled `parts` of one map on the calling thread's team, each reading the buffers at
/// `inputs` and writing `out`: parts that [`Jit::compile_parts`] checked against those buffers
/// and that write disjoint elements (`out`'s access is a permutation, checked by `validate`,
/// and the parts take disjoint ranges of the outer axis).
fn run_compiled_parts(fns: &[KernelFn], inputs: &[*const f32], out: *mut f32) {
    // Raw pointers are not `Send`: they cross to the team's threads as addresses.
    let ptrs: Vec<usize> = inputs.iter().map(|&p| p as usize).collect();
    let out = out as usize;
    let token = crate::cancel::Token::current();
    super::threads::run_parts(fns.len(), |i| {
        let ptrs: Vec<*const f32> = ptrs.iter().map(|&p| p as *const f32).collect();
        call(fns[i], &ptrs, out as *mut f32, &token);
    });
}

/// Whether [`split_outer`] makes more than one part of `k`.
fn splits(k: &MapKernel) -> bool {
    split_parts(k).is_some()
}

/// How many parts [`split_outer`] makes of `k` when more than one.
fn split_parts(k: &MapKernel) -> Option<usize> {
    let &extent = k.shape.first()?;
    let indexed = k.nodes.iter().any(|n| matches!(n, Node::Iota { .. } | Node::Rand { .. } | Node::Randn { .. }));
    let parts = super::threads::loop_parts(extent, k.numel());
    (parts > 1 && !indexed && !k.rows.contains(&0)).then_some(parts)
}

/// A large map kernel split into ranges of its outer axis, one per compute thread: the same
/// kernel over fewer outer iterations, every access moved to the range's start. Not split
/// (one part, the kernel itself): small kernels, an outer axis inside each row, and kernels
/// computing from their linear output index (`arange`, `rand`, `randn`), which would
/// restart at each part.
fn split_outer(k: &MapKernel) -> Vec<Kernel> {
    let Some(parts) = split_parts(k) else { return vec![Kernel::Map(k.clone())] };
    let extent = k.shape[0];
    let step = extent.div_ceil(parts);
    (0..extent)
        .step_by(step)
        .map(|lo| {
            let mut part = k.clone();
            part.shape[0] = step.min(extent - lo);
            for a in part.inputs.iter_mut().chain([&mut part.output]) {
                a.offset += lo as i64 * a.strides[0];
            }
            Kernel::Map(part)
        })
        .collect()
}

/// A matmul kernel (bounds already checked): `sgemm` per batch index, then the epilogue.
///
/// # Safety
/// `out` is valid for writes of the `count * m * n` elements the bounds check covered, which
/// need not be initialized, and nothing else touches them meanwhile.
#[allow(unsafe_code)]
unsafe fn matmul(k: &MatMulKernel, inputs: &[&[f32]], out: *mut f32, epilogue: Option<KernelFn>) {
    let count = k.batch_count();
    if count == 0 || k.m == 0 || k.n == 0 {
        return;
    }
    // With a non-empty batch, the bounds check guaranteed `count * m * n <= out.len()`.
    let per = k.m * k.n;
    if k.k == 0 {
        // A sum of nothing. SAFETY: the caller's.
        unsafe { std::ptr::write_bytes(out, 0, count * per) };
    } else {
        let rank = k.batch.len();
        let mut index = vec![0usize; rank];
        for b in 0..count {
            let c = out.wrapping_add(b * per);
            let mut rest = b;
            for (i, &d) in index.iter_mut().zip(&k.batch).rev() {
                *i = rest % d;
                rest /= d;
            }
            let at = |a: &gt_ir::kernel::Access| {
                a.offset + index.iter().zip(&a.strides).map(|(&i, &s)| i as i64 * s).sum::<i64>()
            };
            let (lhs, rhs) = (inputs[0].as_ptr().wrapping_offset(at(&k.lhs) as isize), inputs[1].as_ptr());
            let rhs = rhs.wrapping_offset(at(&k.rhs) as isize);
            let (ls, rs) = (&k.lhs.strides[rank..], &k.rhs.strides[rank..]);
            // SAFETY: the bounds check covered every element `lhs[b, i, l]` and `rhs[b, l, j]`
            // (offset plus strides over [batch.., m, k] and [batch.., k, n]), which is exactly
            // what sgemm reads from these base pointers and strides; `c` is an exclusive m x n
            // row-major block, fully written (beta = 0 does not read it).
            unsafe {
                Sgemm {
                    m: k.m,
                    k: k.k,
                    n: k.n,
                    a: (lhs, ls[0] as isize, ls[1] as isize),
                    b: (rhs, rs[0] as isize, rs[1] as isize),
                    c: (c, k.n as isize, 1),
                }
                .run();
            }
        }
    }
    if let Some(f) = epilogue {
        // The product is the epilogue map's last input, read at the element it rewrites.
        let product = out;
        let mut ptrs: Vec<*const f32> = inputs[2..].iter().map(|b| b.as_ptr()).collect();
        ptrs.push(product);
        call(f, &ptrs, product, &crate::cancel::Token::current());
    }
}

/// The CLIF the JIT generates for `kernel`, before optimisation: deterministic text for
/// dumps and snapshots, printed for a 64-bit System V target whatever the host. A matmul
/// prints its epilogue map (the product itself is `sgemm`). An `f64` or integer kernel is
/// printed over buffers of its own dtype ([`clif_over`] takes theirs).
pub fn clif(kernel: &Kernel) -> Result<String, JitError> {
    clif_over(kernel, None)
}

/// [`clif`] over buffers stored as `storage` (an `f64` or integer kernel's; `f32` kernels
/// read `f32` buffers whatever they hold, halves widened before).
pub fn clif_over(kernel: &Kernel, storage: Option<&BufferStorage>) -> Result<String, JitError> {
    validate(kernel).map_err(JitError::Invalid)?;
    // Printed as for a host without FMA, so the text is the same on every machine.
    let target = Target {
        fma: false,
        frontend: TargetFrontendConfig {
            default_call_conv: CallConv::SystemV,
            pointer_width: target_lexicon::PointerWidth::U64,
            page_size_align_log2: 12,
        },
    };
    match kernel {
        Kernel::Map(k) => {
            let own = Storage::of(k.compute.dtype());
            let storage = match storage {
                Some(s) if k.compute != gt_ir::kernel::Compute::F32 => s.clone(),
                _ => BufferStorage { output: own, inputs: vec![own; k.inputs.len()] },
            };
            Ok(map_function(k, &storage, target, UserFuncName::testcase("map"))?.display().to_string())
        }
        Kernel::MatMul(k) => match epilogue_map(k) {
            None => Ok("; matmul: sgemm, no epilogue\n".into()),
            Some(m) => {
                let f =
                    map_function(&m, &BufferStorage::f32(m.inputs.len()), target, UserFuncName::testcase("epilogue"))?;
                Ok(format!("; matmul: sgemm, then this epilogue over the product (its last input)\n{}", f.display()))
            }
        },
    }
}
