//! The CUDA backend on a device: a context and a stream per backend, a caching allocator
//! (freed buffers go back to per-size pools, so a steady loop never calls `cuMemAlloc`),
//! modules cached by their kernel (the kernel IR value is the cache key), and launches and
//! copies queued on the stream. [`CudaBackend::finish`] waits for the stream, so errors from
//! queued work surface there. Timed batches record a pair of CUDA events around each
//! instruction's work ([`Timer`]), so the log shows when the device ran it, not when it
//! was queued.
// The driver API is C: launches take arrays of argument pointers and memory is raw device
// addresses. Every unsafe block below is one driver call with arguments this file owns.
#![allow(unsafe_code)]

use super::cache::KernelCache;
use super::ptx::{self, PtxKernel, ENTRY};
use super::staging::{Staging, MIN_STAGED};
use crate::backend::checks;
use crate::backend::{Backend, Residency};
use crate::backend::{BackendError, CudaStartStep, CudaUnavailable};
use crate::error::DeviceStep;
use crate::RuntimeError;
use cust::context::Context;
use cust::device::{Device, DeviceAttribute};
use cust::error::{CudaError, CudaResult};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};
use cust::sys as cu;
use foldhash::{HashMap, HashMapExt};
use gt_ir::data::Elements;
use gt_ir::kernel::lower::{lower, Step};
use gt_ir::kernel::{BufferStorage, Kernel, Precision, Storage};
use gt_ir::{DType, HostTensor, Instr, TensorType, TypeError, ValueId};
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// A value on the device: its type and buffer (address 0 for an empty tensor), elements
/// stored as its dtype says (kernels convert them to what they compute in).
#[derive(Debug)]
struct DeviceTensor {
    ty: TensorType,
    buffer: Buffer,
}

impl DeviceTensor {
    fn storage(&self) -> Storage {
        Storage::of(self.ty.dtype)
    }
}

/// A device allocation of `class` bytes (the size class it is pooled under).
#[derive(Debug, Clone, Copy)]
struct Buffer {
    ptr: cu::CUdeviceptr,
    class: usize,
}

/// A loaded kernel.
struct Compiled {
    // Keeps the function alive.
    _module: Module,
    function: cu::CUfunction,
    launch: PtxKernel,
}

/// Counters for stats and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCounters {
    /// `cuMemAlloc` calls.
    pub allocations: u64,
    /// Buffers handed out from the pool instead.
    pub reuses: u64,
    /// Modules generated and loaded.
    pub compiles: u64,
    /// Kernel launches.
    pub launches: u64,
    /// Modules loaded from the on-disk kernel cache instead of compiled (part of `compiles`).
    pub disk_hits: u64,
}

/// Executes instructions on one GPU.
pub struct CudaBackend {
    values: HashMap<ValueId, DeviceTensor>,
    bytes: Residency,
    pool: HashMap<usize, Vec<cu::CUdeviceptr>>,
    /// By kernel, then by its buffers' storage (the same kernel over `bf16` is other code);
    /// looked up by reference, so a launch clones nothing.
    modules: HashMap<Kernel, Vec<(BufferStorage, Compiled)>>,
    max_tensor_bytes: usize,
    precision: Precision,
    counters: DeviceCounters,
    device_name: String,
    /// Compiled kernels kept on disk, and what they are valid for (device, capability,
    /// driver version).
    cache: KernelCache,
    cache_key: String,
    /// What the generated code is for: Hopper gets its warpgroup matmuls.
    target: ptx::Target,
    /// Pinned chunks for large uploads and reads (made on the first), unless `GT_PINNED=0`
    /// or they could not be made.
    staging: Option<Staging>,
    pinned: bool,
    stream: Stream,
    timer: Option<Timer>,
    /// Events kept for reuse by later timed batches.
    spare_events: Vec<cu::CUevent>,
    // Dropped last: everything above lives in this context.
    _context: Context,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("device", &self.device_name).field("values", &self.values.len()).finish()
    }
}

/// Asks for 2 MiB pages (transparent huge pages) under the whole 2 MiB spans of the `len`
/// bytes at `at`, not yet touched, so that the copy writing them first faults once per 2 MiB
/// instead of once per 4 KiB (page faults, not the copy, bound large reads into fresh memory).
fn advise_huge_pages(at: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = (at as usize).next_multiple_of(HUGE);
    let end = (at as usize + len) / HUGE * HUGE;
    if end > start {
        // Only advice: where the kernel has no huge pages the call fails and nothing changes.
        unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// A failed driver call's result code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DriverError(cu::CUresult);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // The driver returns a pointer to a static string (or leaves it null).
        unsafe { cu::cuGetErrorString(self.0, &mut text) };
        if text.is_null() {
            write!(f, "CUDA error {:?}", self.0)
        } else {
            let text = unsafe { std::ffi::CStr::from_ptr(text) };
            write!(f, "{} ({:?})", text.to_string_lossy(), self.0)
        }
    }
}

pub(super) fn check(result: cu::CUresult) -> Result<(), DriverError> {
    if result == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError(result))
    }
}

/// A driver failure of `op` while doing `step`.
fn device(op: &'static str, step: DeviceStep, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Device { op, step, driver_message: e.to_string() }
}

impl CudaBackend {
    /// Initialises the driver and makes a context and stream on device `ordinal` current on
    /// this thread.
    pub fn new(ordinal: u32, max_tensor_bytes: usize) -> Result<CudaBackend, BackendError> {
        let unavailable = |step: CudaStartStep| {
            move |e: CudaError| {
                BackendError::Unavailable(CudaUnavailable::Driver { step, driver_message: e.to_string() })
            }
        };
        cust::init(cust::CudaFlags::empty()).map_err(unavailable(CudaStartStep::Init))?;
        let count = Device::num_devices().map_err(unavailable(CudaStartStep::CountDevices))?;
        if ordinal >= count {
            return Err(BackendError::Unavailable(CudaUnavailable::NoDevice { ordinal, count }));
        }
        let device = Device::get_device(ordinal).map_err(unavailable(CudaStartStep::OpenDevice))?;
        let major = device.get_attribute(DeviceAttribute::ComputeCapabilityMajor).unwrap_or(0);
        if major < 8 {
            return Err(BackendError::Unavailable(CudaUnavailable::ComputeCapability { ordinal, major }));
        }
        let device_name = device.name().unwrap_or_else(|_| "unknown device".into());
        let minor = device.get_attribute(DeviceAttribute::ComputeCapabilityMinor).unwrap_or(0);
        let mut driver = 0;
        unsafe { cu::cuDriverGetVersion(&mut driver) };
        let cache_key = format!("{device_name} sm_{major}{minor} driver {driver}");
        let context = Context::new(device).map_err(unavailable(CudaStartStep::CreateContext))?;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).map_err(unavailable(CudaStartStep::CreateStream))?;
        Ok(CudaBackend {
            values: HashMap::new(),
            bytes: Residency::default(),
            pool: HashMap::new(),
            modules: HashMap::new(),
            max_tensor_bytes,
            precision: Precision::F32,
            counters: DeviceCounters::default(),
            device_name,
            cache: KernelCache::from_env(),
            cache_key,
            target: ptx::Target::of(major, minor, std::env::var("GT_WGMMA").map_or(true, |v| v != "0")),
            staging: None,
            pinned: std::env::var("GT_PINNED").map_or(true, |v| v != "0"),
            stream,
            timer: None,
            spare_events: Vec::new(),
            _context: context,
        })
    }

    /// Whether large uploads and reads go through pinned host buffers (`GT_PINNED`, on by
    /// default).
    pub fn set_pinned(&mut self, pinned: bool) {
        self.pinned = pinned;
    }

    /// The pinned chunks for a copy of `bytes`, if it is staged.
    fn staging_for(&mut self, bytes: usize) -> Option<&mut Staging> {
        if !self.pinned || bytes < MIN_STAGED {
            return None;
        }
        if self.staging.is_none() {
            // Without pinned memory (a locked-memory limit) copies stay pageable.
            self.staging = Staging::new().ok();
            self.pinned = self.staging.is_some();
        }
        self.staging.as_mut()
    }

    /// Copies device memory at `src` into `host` and waits for it; every byte of `host` is
    /// written when this returns `Ok`.
    fn copy_out(&mut self, src: cu::CUdeviceptr, host: &mut [MaybeUninit<u8>]) -> Result<(), RuntimeError> {
        let fail = |e: DriverError| device("get", DeviceStep::CopyFromDevice, e);
        let stream = self.stream.as_inner();
        if let Some(staging) = self.staging_for(host.len()) {
            return staging.read(src, host, stream).map_err(fail);
        }
        if !host.is_empty() {
            check(unsafe { cu::cuMemcpyDtoHAsync_v2(host.as_mut_ptr() as *mut c_void, src, host.len(), stream) })
                .map_err(fail)?;
        }
        self.stream.synchronize().map_err(|e| device("get", DeviceStep::CopyFromDevice, e))
    }

    /// A read's `len` elements, copied from device memory at `src` into a new vector.
    fn read_vec<T: bytemuck::Pod>(&mut self, src: cu::CUdeviceptr, len: usize) -> Result<Vec<T>, RuntimeError> {
        let mut v: Vec<T> = Vec::with_capacity(len);
        let bytes = len * std::mem::size_of::<T>();
        advise_huge_pages(v.as_mut_ptr() as *mut u8, bytes);
        // The spare capacity as bytes, all of them written by the copy before `set_len`.
        let spare = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut MaybeUninit<u8>, bytes) };
        self.copy_out(src, spare)?;
        unsafe { v.set_len(len) };
        Ok(v)
    }

    /// What this device's kernels are generated for.
    pub fn target(&self) -> ptx::Target {
        self.target
    }

    /// How matmul instructions multiply (`GT_MATMUL_PRECISION`): f32 by default, TF32
    /// tensor cores when asked.
    pub fn set_matmul_precision(&mut self, precision: Precision) {
        self.precision = precision;
    }

    /// Where compiled kernels are kept between processes (`GT_KERNEL_CACHE`, else the user's
    /// cache directory).
    pub fn set_kernel_cache(&mut self, cache: KernelCache) {
        self.cache = cache;
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Allocation, compile and launch counts so far.
    pub fn counters(&self) -> DeviceCounters {
        self.counters
    }

    /// Runs one kernel of the kernel IR on live values, defining `dst` of type `ty` (how the
    /// fuse pass's kernels run, and benchmarks of hand-built kernels).
    pub fn run_kernel(
        &mut self,
        kernel: &Kernel,
        inputs: &[ValueId],
        dst: ValueId,
        ty: TensorType,
    ) -> Result<(), RuntimeError> {
        let op = "kernel";
        let buffers = inputs
            .iter()
            .map(|v| self.values.get(v).map(|t| t.buffer).ok_or(RuntimeError::Undefined { op, value: *v }))
            .collect::<Result<Vec<_>, _>>()?;
        let lens: Vec<usize> = inputs.iter().map(|v| self.values[v].ty.shape.numel()).collect();
        kernel.check_bounds(&lens, ty.shape.numel()).map_err(|source| RuntimeError::Kernel { op, source })?;
        let output = Storage::of(ty.dtype);
        let storage = BufferStorage { output, inputs: inputs.iter().map(|v| self.values[v].storage()).collect() };
        let out = self.alloc(op, ty.size_bytes())?;
        if let Err(e) = self.launch(op, kernel, &storage, out, &buffers) {
            self.release(out);
            return Err(e);
        }
        self.define(dst, DeviceTensor { ty, buffer: out });
        Ok(())
    }

    /// Makes `t` the value `dst`, letting go of the one it replaces.
    fn define(&mut self, dst: ValueId, t: DeviceTensor) {
        self.bytes.add(t.ty.size_bytes());
        if let Some(old) = self.values.insert(dst, t) {
            self.bytes.remove(old.ty.size_bytes());
            self.release(old.buffer);
        }
    }

    /// Copies `src` into a new value `dst` with the driver's device-to-device copy (the
    /// bandwidth yardstick of the benchmarks).
    pub fn copy(&mut self, src: ValueId, dst: ValueId) -> Result<(), RuntimeError> {
        let op = "copy";
        let t = self.values.get(&src).ok_or(RuntimeError::Undefined { op, value: src })?;
        let (ty, from) = (t.ty.clone(), t.buffer.ptr);
        let bytes = ty.size_bytes();
        let out = self.alloc(op, bytes)?;
        let stream = self.stream.as_inner();
        if bytes > 0 {
            if let Err(e) = check(unsafe { cu::cuMemcpyDtoDAsync_v2(out.ptr, from, bytes, stream) }) {
                self.release(out);
                return Err(device(op, DeviceStep::CopyDeviceToDevice, e));
            }
        }
        self.define(dst, DeviceTensor { ty, buffer: out });
        Ok(())
    }

    /// The pool a request of `bytes` is served from: 512-byte steps up to 1 MiB, then
    /// 1 MiB steps (at most 1/2 MiB of slack on large tensors, and equal shapes share).
    fn size_class(bytes: usize) -> usize {
        if bytes <= 1 << 20 {
            bytes.div_ceil(512) * 512
        } else {
            bytes.div_ceil(1 << 20) << 20
        }
    }

    fn alloc(&mut self, op: &'static str, bytes: usize) -> Result<Buffer, RuntimeError> {
        if bytes == 0 {
            return Ok(Buffer { ptr: 0, class: 0 });
        }
        let class = Self::size_class(bytes);
        if let Some(ptr) = self.pool.get_mut(&class).and_then(Vec::pop) {
            self.counters.reuses += 1;
            return Ok(Buffer { ptr, class });
        }
        let mut ptr: cu::CUdeviceptr = 0;
        let mut result = check(unsafe { cu::cuMemAlloc_v2(&mut ptr, class) });
        if matches!(result, Err(DriverError(cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY))) {
            // Pooled buffers of other sizes may be what is missing: give them back and retry.
            self.release_pool();
            result = check(unsafe { cu::cuMemAlloc_v2(&mut ptr, class) });
        }
        result.map_err(|e| RuntimeError::DeviceMemory {
            op,
            bytes,
            device: self.device_name.clone(),
            driver_message: e.to_string(),
            values: self.values.len(),
            live: self.live_bytes(),
        })?;
        self.counters.allocations += 1;
        Ok(Buffer { ptr, class })
    }

    fn release(&mut self, buffer: Buffer) {
        // Stream order makes reuse safe: later work on this stream runs after the last
        // use of the buffer by earlier work.
        if buffer.ptr != 0 {
            self.pool.entry(buffer.class).or_default().push(buffer.ptr);
        }
    }

    fn release_pool(&mut self) {
        let _ = self.stream.synchronize();
        for (_, ptrs) in self.pool.drain() {
            for ptr in ptrs {
                unsafe {
                    let _ = cu::cuMemFree_v2(ptr);
                }
            }
        }
    }

    fn compiled(
        &mut self,
        op: &'static str,
        kernel: &Kernel,
        storage: &BufferStorage,
    ) -> Result<&Compiled, RuntimeError> {
        let known = |m: &HashMap<Kernel, Vec<(BufferStorage, Compiled)>>| {
            m.get(kernel).and_then(|v| v.iter().position(|(s, _)| s == storage))
        };
        if known(&self.modules).is_none() {
            let launch =
                ptx::generate_for(kernel, storage, self.target).map_err(|source| RuntimeError::Ptx { op, source })?;
            let module = self
                .load_module(&launch.text)
                .map_err(|e| device(op, DeviceStep::LoadModule { kernel: kernel.kind() }, e))?;
            let function = module
                .get_function(ENTRY)
                .map_err(|e| device(op, DeviceStep::FindEntry { kernel: kernel.kind() }, e))?
                .to_raw();
            if launch.shared > 0 {
                // Above 48 KiB a kernel must opt in to its dynamic shared memory.
                let attribute = cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                check(unsafe { cu::cuFuncSetAttribute(function, attribute, launch.shared as i32) })
                    .map_err(|e| device(op, DeviceStep::LoadModule { kernel: kernel.kind() }, e))?;
            }
            self.counters.compiles += 1;
            let compiled = Compiled { _module: module, function, launch };
            self.modules.entry(kernel.clone()).or_default().push((storage.clone(), compiled));
        }
        let i = known(&self.modules).expect("compiled above");
        Ok(&self.modules[kernel][i].1)
    }

    /// The module of `ptx`: from the disk cache when it holds it, else compiled (through the
    /// driver's linker, so that the machine code can be kept for the next process).
    fn load_module(&mut self, ptx: &str) -> CudaResult<Module> {
        if self.cache.dir().is_none() {
            return Module::from_ptx(ptx, &[]);
        }
        let key = KernelCache::key(ptx, &self.cache_key);
        if let Some(cubin) = self.cache.load(&key) {
            match Module::from_cubin(&cubin, &[]) {
                Ok(m) => {
                    self.counters.disk_hits += 1;
                    return Ok(m);
                }
                // Damaged, or from another driver: compile again and replace it.
                Err(_) => self.cache.remove(&key),
            }
        }
        match link(ptx) {
            Ok(cubin) => {
                let module = Module::from_cubin(&cubin, &[])?;
                self.cache.store(&key, &cubin);
                Ok(module)
            }
            // The linker refused: compiling directly gives the driver's own error.
            Err(_) => Module::from_ptx(ptx, &[]),
        }
    }

    /// Compiles what [`CudaBackend::launch`] will run for `kernel`.
    fn prepare(&mut self, op: &'static str, kernel: &Kernel, storage: &BufferStorage) -> Result<(), RuntimeError> {
        match ptx::transposed_rhs(kernel, storage, self.target) {
            Some(t) => {
                self.compiled(op, &t.transpose, &BufferStorage::f32(1))?;
                self.compiled(op, &t.matmul, storage)?;
            }
            None => {
                self.compiled(op, kernel, storage)?;
            }
        }
        Ok(())
    }

    /// Runs `kernel`: one launch, or on Hopper a TF32 matmul of a row-major B as a transpose
    /// of B into a pooled temporary and the matmul reading it ([`ptx::transposed_rhs`]).
    fn launch(
        &mut self,
        op: &'static str,
        kernel: &Kernel,
        storage: &BufferStorage,
        out: Buffer,
        inputs: &[Buffer],
    ) -> Result<(), RuntimeError> {
        let Some(t) = ptx::transposed_rhs(kernel, storage, self.target) else {
            return self.launch_one(op, kernel, storage, out, inputs);
        };
        let temp = self.alloc(op, t.elements * Storage::F32.bytes())?;
        let mut buffers = inputs.to_vec();
        buffers[1] = temp;
        let result = self
            .launch_one(op, &t.transpose, &BufferStorage::f32(1), temp, &inputs[1..2])
            .and_then(|()| self.launch_one(op, &t.matmul, storage, out, &buffers));
        // Stream order: the pool hands the temporary out again only to later work.
        self.release(temp);
        result
    }

    /// One launch of `kernel` on the stream, compiled first if new.
    fn launch_one(
        &mut self,
        op: &'static str,
        kernel: &Kernel,
        storage: &BufferStorage,
        out: Buffer,
        inputs: &[Buffer],
    ) -> Result<(), RuntimeError> {
        let stream = self.stream.as_inner();
        let compiled = self.compiled(op, kernel, storage)?;
        let mut args: Vec<u64> = std::iter::once(out.ptr).chain(inputs.iter().map(|b| b.ptr)).collect();
        let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| a as *mut u64 as *mut c_void).collect();
        let (g, b) = (compiled.launch.grid, compiled.launch.block);
        let result = check(unsafe {
            cu::cuLaunchKernel(
                compiled.function,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                compiled.launch.shared,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        });
        result.map_err(|e| device(op, DeviceStep::Launch { kernel: kernel.kind(), grid: g, block: b }, e))?;
        self.counters.launches += 1;
        Ok(())
    }

    fn upload(&mut self, op: &'static str, dst: Buffer, data: &[u8]) -> Result<(), RuntimeError> {
        // Pinned or pageable, the copy is staged before the call returns, so `data` may be
        // dropped right after.
        let (bytes, stream) = (data.len(), self.stream.as_inner());
        if let Some(staging) = self.staging_for(bytes) {
            return staging.upload(dst.ptr, data, stream).map_err(|e| device(op, DeviceStep::CopyToDevice, e));
        }
        check(unsafe { cu::cuMemcpyHtoDAsync_v2(dst.ptr, data.as_ptr() as *const c_void, bytes, stream) })
            .map_err(|e| device(op, DeviceStep::CopyToDevice, e))
    }

    fn type_of(&self, v: ValueId) -> Result<TensorType, TypeError> {
        self.values.get(&v).map(|t| t.ty.clone()).ok_or(TypeError::UnknownValue(v))
    }

    /// Runs `steps` with the storage of their kernels' buffers (`storage[i]` for step `i`).
    fn run_steps(
        &mut self,
        op: &'static str,
        instr: &Instr,
        (steps, storage): (&[Step], &[Vec<BufferStorage>]),
        outputs: &[Buffer],
    ) -> Result<(), RuntimeError> {
        for (step, storage) in steps.iter().zip(storage) {
            match step {
                Step::Launch { kernel, inputs, output } => {
                    let buffers: Vec<Buffer> = inputs.iter().map(|v| self.values[v].buffer).collect();
                    self.launch(op, kernel, &storage[0], outputs[*output], &buffers)?;
                }
                Step::TwoPass { first, inputs, partials, second, output } => {
                    let buffers: Vec<Buffer> = inputs.iter().map(|v| self.values[v].buffer).collect();
                    let temp = self.alloc(op, partials * Step::partial_storage(first).bytes())?;
                    let result = self
                        .launch(op, first, &storage[0], temp, &buffers)
                        .and_then(|()| self.launch(op, second, &storage[1], outputs[*output], &[temp]));
                    // Stream order: the pool hands the temporary out again only to later work.
                    self.release(temp);
                    result?;
                }
                Step::Upload { output } => {
                    // The type rule made the data's dtype the literal's.
                    if let Instr::Literal { data, .. } = instr {
                        self.upload(op, outputs[*output], &data.to_le_bytes())?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Compiles a PTX module to machine code (a cubin) with the driver's linker.
fn link(ptx: &str) -> Result<Vec<u8>, DriverError> {
    let text = std::ffi::CString::new(ptx).map_err(|_| DriverError(cu::CUresult::CUDA_ERROR_INVALID_VALUE))?;
    let name = c"gt_kernel.ptx";
    let mut state: cu::CUlinkState = std::ptr::null_mut();
    check(unsafe { cu::cuLinkCreate_v2(0, std::ptr::null_mut(), std::ptr::null_mut(), &mut state) })?;
    let result = (|| {
        let bytes = text.as_bytes_with_nul();
        check(unsafe {
            cu::cuLinkAddData_v2(
                state,
                cu::CUjitInputType::CU_JIT_INPUT_PTX,
                bytes.as_ptr() as *mut c_void,
                bytes.len(),
                name.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        })?;
        let (mut cubin, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        check(unsafe { cu::cuLinkComplete(state, &mut cubin, &mut size) })?;
        // The linker owns the cubin until it is destroyed: copy it out first.
        Ok(unsafe { std::slice::from_raw_parts(cubin as *const u8, size) }.to_vec())
    })();
    unsafe { cu::cuLinkDestroy(state) };
    result
}

/// The device times of a timed batch: an anchor event recorded on the idle stream when the
/// batch began (taken to run at the host time read just before), and a start and end event
/// around each instruction's work; read once the stream is done.
struct Timer {
    anchor: cu::CUevent,
    /// Nanoseconds since `epoch` when the anchor was recorded.
    anchor_host: u64,
    marks: Vec<(cu::CUevent, cu::CUevent)>,
}

impl CudaBackend {
    fn event(&mut self) -> Option<cu::CUevent> {
        if let Some(e) = self.spare_events.pop() {
            return Some(e);
        }
        let mut e: cu::CUevent = std::ptr::null_mut();
        let flags = cu::CUevent_flags::CU_EVENT_DEFAULT as std::os::raw::c_uint;
        check(unsafe { cu::cuEventCreate(&mut e, flags) }).ok().map(|()| e)
    }

    /// Records `e` on the stream; `false` if the driver refused.
    fn record(&self, e: cu::CUevent) -> bool {
        check(unsafe { cu::cuEventRecord(e, self.stream.as_inner()) }).is_ok()
    }

    /// Records an event on the stream for the running timer (`None` when not timing, or the
    /// driver refused: that batch then reports host times).
    fn mark(&mut self) -> Option<cu::CUevent> {
        self.timer.as_ref()?;
        let e = self.event()?;
        if self.record(e) {
            Some(e)
        } else {
            self.spare_events.push(e);
            self.timer = None;
            None
        }
    }

    /// Stops timing; the events are kept for the next timed batch.
    fn end_timing(&mut self) {
        if let Some(t) = self.timer.take() {
            self.spare_events.push(t.anchor);
            self.spare_events.extend(t.marks.into_iter().flat_map(|(a, b)| [a, b]));
        }
    }

    fn execute_instr(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        let op = instr.mnemonic();
        let (instr, types) = checks::prepare(instr, &|v| self.type_of(v), self.max_tensor_bytes)?;
        // Products compute in f32 over f32 or halves: integer and f64 ones are refused by
        // name rather than reinterpreted.
        checks::products_of_floats(&instr, "cuda", &|v| self.type_of(v))?;
        let mut steps = lower(&instr, &|v| self.values[&v].ty.clone(), &types);
        if self.precision == Precision::Tf32 {
            for step in &mut steps {
                if let Step::Launch { kernel: Kernel::MatMul(m), .. } = step {
                    m.precision = Precision::Tf32;
                }
            }
        }
        let storage: Vec<_> = steps.iter().map(|s| s.storage(|v| self.values[&v].ty.dtype, &types)).collect();
        // Compile first: a kernel that cannot be generated fails before any allocation.
        for (step, storage) in steps.iter().zip(&storage) {
            match step {
                Step::Launch { kernel, .. } => self.prepare(op, kernel, &storage[0])?,
                Step::TwoPass { first, second, .. } => {
                    self.compiled(op, first, &storage[0])?;
                    self.compiled(op, second, &storage[1])?;
                }
                Step::Upload { .. } => {}
            }
        }
        let mut outputs = Vec::with_capacity(types.len());
        for ty in &types {
            match self.alloc(op, ty.size_bytes()) {
                Ok(b) => outputs.push(b),
                Err(e) => {
                    outputs.into_iter().for_each(|b| self.release(b));
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.run_steps(op, &instr, (&steps, &storage), &outputs) {
            outputs.into_iter().for_each(|b| self.release(b));
            return Err(e);
        }
        if let Instr::Free { src } = &*instr {
            if let Some(t) = self.values.remove(src) {
                self.bytes.remove(t.ty.size_bytes());
                self.release(t.buffer);
            }
        }
        for ((dst, ty), buffer) in instr.results().into_iter().zip(types).zip(outputs) {
            self.define(dst, DeviceTensor { ty, buffer });
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        let start = self.mark();
        let result = self.execute_instr(instr);
        // Every instruction gets its pair, failed ones too, so marks line up with the batch.
        if let Some(start) = start {
            match self.mark() {
                Some(end) => self.timer.as_mut().expect("marked").marks.push((start, end)),
                None => self.spare_events.push(start),
            }
        }
        result
    }

    fn start_timing(&mut self, epoch: std::time::Instant) {
        self.end_timing();
        let Some(anchor) = self.event() else { return };
        // The stream is idle between batches (each ends with `finish`): the anchor runs at
        // once, at about the host time read here.
        let anchor_host = epoch.elapsed().as_nanos() as u64;
        if self.record(anchor) {
            self.timer = Some(Timer { anchor, anchor_host, marks: Vec::new() });
        } else {
            self.spare_events.push(anchor);
        }
    }

    fn take_timings(&mut self) -> Option<Vec<gt_transport::message::Timing>> {
        let timer = self.timer.as_ref()?;
        let elapsed = |from: cu::CUevent, to: cu::CUevent| {
            let mut ms = 0f32;
            check(unsafe { cu::cuEventElapsedTime(&mut ms, from, to) }).ok().map(|()| (ms as f64 * 1e6) as u64)
        };
        let timings: Option<Vec<_>> = timer
            .marks
            .iter()
            .map(|&(start, end)| {
                let at = timer.anchor_host + elapsed(timer.anchor, start)?;
                Some(gt_transport::message::Timing { index: 0, start: at, nanos: elapsed(start, end)? })
            })
            .collect();
        self.end_timing();
        timings
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        let t = self.values.get(&value).ok_or(RuntimeError::Undefined { op: "get", value })?;
        let (ptr, ty) = (t.buffer.ptr, t.ty.clone());
        if ty.dtype == DType::F32 {
            let data: Vec<f32> = self.read_vec(ptr, ty.shape.numel())?;
            return Ok(HostTensor::new(ty, data));
        }
        let bytes: Vec<u8> = self.read_vec(ptr, ty.size_bytes())?;
        let data =
            Elements::from_le_bytes(ty.dtype, &bytes).map_err(|e| device("get", DeviceStep::CopyFromDevice, e))?;
        Ok(HostTensor::new(ty, data))
    }

    fn finish(&mut self) -> Result<(), RuntimeError> {
        let r: CudaResult<()> = self.stream.synchronize();
        r.map_err(|e| device("sync", DeviceStep::Sync, e))
    }

    fn live_values(&self) -> usize {
        self.values.len()
    }

    fn live_bytes(&self) -> usize {
        self.bytes.live()
    }

    fn peak_bytes(&self) -> usize {
        self.bytes.peak()
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let buffers: Vec<Buffer> = self.values.drain().map(|(_, t)| t.buffer).collect();
        buffers.into_iter().for_each(|b| self.release(b));
        self.release_pool();
        self.end_timing();
        for e in self.spare_events.drain(..) {
            unsafe { cu::cuEventDestroy_v2(e) };
        }
    }
}
