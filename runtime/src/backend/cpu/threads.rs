//! The CPU worker's threads (embedded workers each get their share of the machine's cores),
//! used to split large work: a team (`micropool`: the worker's thread and spinning helpers)
//! for the matrix product (`sgemm`: rows or columns of the result per thread), the JIT's
//! kernels (ranges of their outer axis, [`run_parts`]) and the interpreter's elementwise
//! loops over contiguous operands (stretches, [`filled`]), and a `rayon` pool for its
//! strided or broadcast ones (through `ndarray`'s parallel `Zip`). Small work stays on the
//! calling thread: splitting costs more than it saves below [`PARALLEL_MIN_FLOPS`],
//! [`TEAM_MIN_ELEMENTS`] and [`PARALLEL_MIN_ELEMENTS`].

use crate::backend::cpu::{small_product, vmath};
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Products of fewer multiply-adds than this (about 25 µs on one core) run on the calling
/// thread. Measured on the 2-core VM with the team: 128³ (2M) 54 µs alone, 32 µs split;
/// the MLP's 64x784x256 351 µs alone, 188 µs split (a `rayon` scope took 290 µs there,
/// its wake-ups costing as much as the split saved below 256³).
pub const PARALLEL_MIN_FLOPS: usize = 1 << 20;

/// Elementwise results with fewer elements than this are computed on the calling thread by
/// `ndarray`'s strided loops, whose split runs on the `rayon` pool (measured on the 2-core
/// VM, where waking a pool thread costs tens of µs: splitting the MLP's 200k-element SGD
/// updates through it made its step 30% slower).
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 20;

/// Contiguous elementwise results (and compiled map kernels) with at least this many
/// elements (256 KiB of f32, ~10 µs of a cheap op on one core) split over the team, whose
/// split costs about a µs.
pub const TEAM_MIN_ELEMENTS: usize = 1 << 16;

/// Rows or columns each part of a split product has at least.
const MIN_PART: usize = 32;

/// Multiply-adds a product computes between looks at whether its instruction was cancelled
/// (about 50-100 ms on one core), unless that is fewer than [`MIN_BLOCK`] rows.
pub const BLOCK_FLOPS: usize = 1 << 30;

/// Rows (or columns) a block has at least: each `sgemm` call packs the other operand anew,
/// which costs about 1/rows of the block's work.
const MIN_BLOCK: usize = 256;

/// The longest `k` one `sgemm` call runs over; longer ones are summed stretch by stretch
/// (which rounds differently from one call, so only lengths no real tensor reaches here).
pub const K_BLOCK: usize = 1 << 28;

thread_local! {
    /// Where `ndarray`'s parallel loops split (large elementwise ops, [`elementwise`]).
    static POOL: RefCell<Option<Arc<rayon::ThreadPool>>> = const { RefCell::new(None) };
    /// Where products and compiled kernels split ([`run_parts`]).
    static TEAM: RefCell<Option<Arc<micropool::ThreadPool>>> = const { RefCell::new(None) };
}

/// Why a pool could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start {threads} compute threads: {source}")]
pub struct ThreadsError {
    /// How many were asked for.
    pub threads: usize,
    /// Why.
    pub source: rayon::ThreadPoolBuildError,
}

/// How long a compute thread of the team waits, spinning, for the worker's next split before
/// it sleeps (when waits spin at all: `GT_SPIN_US` > 0). Longer than a message wait: the
/// splits of a training step come a few hundred µs apart, and a sleeping thread woken
/// through the kernel costs 20-100 µs on a VM (more than the split saves on a 64-row
/// product). As OpenMP's `KMP_BLOCKTIME`, only shorter (OpenMP spins 200 ms).
pub const TEAM_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// Gives the calling thread (a worker) `threads` compute threads; 1 (or 0) keeps all work
/// on it. `spin`: how long its waits spin before they sleep (zero: the team's threads sleep
/// as soon as they have nothing to do; else they spin [`TEAM_SPIN`]).
pub fn use_threads(threads: usize, spin: std::time::Duration) -> Result<(), ThreadsError> {
    let (pool, team) = if threads > 1 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("gt-compute-{i}"))
            .build()
            .map_err(|source| ThreadsError { threads, source })?;
        // The team: the calling thread and `threads - 1` helpers.
        let spins = if spin.is_zero() { 0 } else { spin_loops(TEAM_SPIN) };
        let team = micropool::ThreadPoolBuilder::default()
            .num_threads(threads - 1)
            .idle_spin_cycles(spins)
            .spawn_handler(|i, body| {
                std::thread::Builder::new()
                    .name(format!("gt-team-{i}"))
                    .spawn(body)
                    .expect("the rayon pool's threads of this worker started, so can its team's")
            })
            .build();
        (Some(Arc::new(pool)), Some(Arc::new(team)))
    } else {
        (None, None)
    };
    POOL.with(|p| *p.borrow_mut() = pool);
    TEAM.with(|p| *p.borrow_mut() = team);
    Ok(())
}

/// How many `spin_loop` hints take about `time` on this CPU (a pause costs 1-40 ns depending
/// on the core; measured once per process).
fn spin_loops(time: std::time::Duration) -> usize {
    static NANOS_PER_LOOP: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let per = *NANOS_PER_LOOP.get_or_init(|| {
        const LOOPS: u32 = 4096;
        let start = std::time::Instant::now();
        for _ in 0..LOOPS {
            std::hint::spin_loop();
        }
        (start.elapsed().as_nanos() as f64 / f64::from(LOOPS)).max(0.5)
    });
    (time.as_nanos() as f64 / per) as usize
}

/// The calling thread's compute threads (1: none but itself).
pub fn threads() -> usize {
    POOL.with(|p| p.borrow().as_ref().map_or(1, |p| p.current_num_threads()))
}

/// Runs `parallel` on the calling thread's pool (where `rayon`'s parallel iterators then
/// split its work) when there is one and `elements` is large enough to pay, else `serial`
/// here. Both must compute the same thing.
pub fn elementwise<R: Send>(elements: usize, parallel: impl FnOnce() -> R + Send, serial: impl FnOnce() -> R) -> R {
    let pool = POOL.with(|p| p.borrow().clone());
    match pool {
        Some(pool) if elements >= PARALLEL_MIN_ELEMENTS => pool.install(parallel),
        _ => serial(),
    }
}

/// Into how many parts to split a loop of `extent` outer iterations over `elements`
/// elements in all: one per thread of the calling thread's pool when it is large enough to
/// pay, else 1.
pub fn loop_parts(extent: usize, elements: usize) -> usize {
    let threads = threads();
    if threads <= 1 || elements < TEAM_MIN_ELEMENTS {
        1
    } else {
        threads.min(extent).max(1)
    }
}

/// Runs `part(0..parts)` on the calling thread and its team (here, in order, without one)
/// and returns when all are done. The calling thread computes parts too, and the team's
/// threads spin between splits, so a split costs about a µs instead of the two kernel
/// wake-ups a `rayon` scope entered from outside its pool costs. A part that panics does not
/// take the process down: the panic is carried to the caller once every part is done.
pub fn run_parts(parts: usize, part: impl Fn(usize) + Sync) {
    let team = TEAM.with(|p| p.borrow().clone());
    match team {
        Some(team) if parts > 1 => {
            let panicked = std::sync::Mutex::new(None);
            let guarded = |i: usize| {
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| part(i))) {
                    panicked.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
                }
            };
            split(&team, 0, parts, &guarded);
            if let Some(payload) = panicked.into_inner().unwrap_or_else(|e| e.into_inner()) {
                std::panic::resume_unwind(payload);
            }
        }
        _ => (0..parts).for_each(part),
    }
}

/// `n` values written by `fill(start, out)` for consecutive stretches `out` of the result
/// starting at element `start` (split as `stretch_of` says). `fill` must write every element of
/// its stretch, each the same value whatever the stretch; nothing is written before it (zeros
/// first would cost a pass over the result).
pub fn written(n: usize, fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync) -> Vec<f32> {
    // A small result takes a buffer a value let go of (`spare`).
    written_in(super::spare::take(n), n, fill)
}

/// [`written`] for elements of another type (`f64` and integer tensors), in a fresh buffer.
pub fn written_as<T: Send>(n: usize, fill: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync) -> Vec<T> {
    written_in(Vec::with_capacity(n), n, fill)
}

/// [`written`] into `out`, which holds room for `n` elements and none yet.
#[allow(unsafe_code)]
fn written_in<T>(mut out: Vec<T>, n: usize, fill: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync) -> Vec<T> {
    debug_assert!(out.is_empty() && out.capacity() >= n);
    let base = Base(out.as_mut_ptr());
    let step = stretch_of(n);
    run_parts(n.div_ceil(step), |i| {
        let (lo, hi) = (i * step, ((i + 1) * step).min(n));
        // SAFETY: `lo..hi` lies inside `out`'s capacity and no other part's range; a slice of
        // `MaybeUninit` may cover memory not yet written.
        let stretch = unsafe { std::slice::from_raw_parts_mut(base.at(lo).cast::<MaybeUninit<T>>(), hi - lo) };
        fill(lo, stretch);
    });
    // SAFETY: the parts' ranges cover `0..n` and `fill` wrote each element of its own; a part
    // that panicked unwinds out of `run_parts` before this, and `out` drops empty.
    unsafe { out.set_len(n) };
    out
}

/// [`written`] over elements already there: `update(start, stretch)` rewrites consecutive
/// stretches of `data` in place (an elementwise op over an operand that dies with it), split
/// over the team as [`written`] splits a result.
#[allow(unsafe_code)]
pub fn rewritten(data: &mut [f32], update: impl Fn(usize, &mut [f32]) + Sync) {
    let n = data.len();
    let base = Base(data.as_mut_ptr());
    let step = stretch_of(n);
    run_parts(n.div_ceil(step), |i| {
        let (lo, hi) = (i * step, ((i + 1) * step).min(n));
        // SAFETY: `lo..hi` lies inside `data`, which `run_parts` outlives, and no other
        // part's range.
        update(lo, unsafe { std::slice::from_raw_parts_mut(base.at(lo), hi - lo) });
    });
}

/// How many elements of an `n`-element loop one part takes: all of them when small, else one
/// part per thread or, for large loops, [`TEAM_MIN_ELEMENTS`] (the team's threads take them as
/// they come free, so one thread held up by the other threads of the process does not hold
/// up the op).
fn stretch_of(n: usize) -> usize {
    let threads = if n < TEAM_MIN_ELEMENTS { 1 } else { threads() };
    if threads <= 1 {
        n.max(1)
    } else if n >= threads * 4 * TEAM_MIN_ELEMENTS {
        TEAM_MIN_ELEMENTS
    } else {
        n.div_ceil(threads)
    }
}

/// [`written`] for a `fill` that takes initialized stretches (`vmath`'s slice functions): each
/// stretch is zeroed right before it is filled, while it is in cache.
pub fn filled(n: usize, fill: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    written(n, |at, out| fill(at, zeroed(out)))
}

/// `out` with every element set to zero, as initialized `f32`s.
#[allow(unsafe_code)]
pub fn zeroed(out: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    out.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was just written; `MaybeUninit<f32>` has `f32`'s layout.
    unsafe { &mut *(std::ptr::from_mut(out) as *mut [f32]) }
}

/// The start of a result being filled, shared by the parts that write disjoint ranges of it.
struct Base<T>(*mut T);

// By hand: a derive would ask `T: Copy`, and the pointer is copied whatever it points to.
impl<T> Clone for Base<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Base<T> {}

// SAFETY: only `written` and `rewritten` make one, and their parts write disjoint ranges of
// the buffer, which outlives `run_parts`.
#[allow(unsafe_code)]
unsafe impl<T> Send for Base<T> {}
#[allow(unsafe_code)]
unsafe impl<T> Sync for Base<T> {}

impl<T> Base<T> {
    /// The element at `index` (a method, so closures capture the `Send` wrapper whole).
    fn at(self, index: usize) -> *mut T {
        self.0.wrapping_add(index)
    }
}

/// Parts `lo..hi` by halves: `micropool` joins two closures at a time (the caller takes one).
fn split(team: &micropool::ThreadPool, lo: usize, hi: usize, part: &(impl Fn(usize) + Sync)) {
    if hi - lo == 1 {
        part(lo)
    } else {
        let mid = lo + (hi - lo) / 2;
        team.join(|| split(team, lo, mid, part), || split(team, mid, hi, part));
    }
}

/// How many parts to split `extent` rows (or columns) of a product of `flops`
/// multiply-adds into: one per thread when it pays, else 1.
fn parts(extent: usize, flops: usize, threads: usize) -> usize {
    if threads <= 1 || flops < PARALLEL_MIN_FLOPS {
        1
    } else {
        threads.min(extent / MIN_PART).max(1)
    }
}

/// One product `c = a b` as `matrixmultiply::sgemm` takes it: an `m x k` `a`, a `k x n` `b`
/// and an `m x n` `c`, each a pointer with row and column strides in elements.
#[derive(Debug, Clone, Copy)]
pub struct Sgemm {
    /// Rows of `a` and `c`.
    pub m: usize,
    /// Columns of `a`, rows of `b`.
    pub k: usize,
    /// Columns of `b` and `c`.
    pub n: usize,
    /// `a` and its row and column strides.
    pub a: (*const f32, isize, isize),
    /// `b` and its strides.
    pub b: (*const f32, isize, isize),
    /// `c` and its strides.
    pub c: (*mut f32, isize, isize),
}

// SAFETY: an `Sgemm` is only run through `Sgemm::run`, whose contract makes the caller vouch
// for the pointers for the duration of the call; the parts it hands to other threads read
// `a` and `b` and write disjoint blocks of `c`, and the call returns only when all are done.
#[allow(unsafe_code)]
unsafe impl Send for Sgemm {}
#[allow(unsafe_code)]
unsafe impl Sync for Sgemm {}

#[allow(unsafe_code)]
impl Sgemm {
    /// Computes `c = a b` (alpha 1, beta 0), split over the calling thread's pool by rows
    /// of `c` (or columns, when it has more of those) when large. Each part is an `sgemm`
    /// over the same `k`, so every element is computed exactly as unsplit. Each part runs
    /// in blocks of about [`BLOCK_FLOPS`] multiply-adds and stops between blocks once its
    /// instruction is cancelled ([`crate::cancel`]), leaving `c` partly written.
    ///
    /// # Safety
    /// As `matrixmultiply::sgemm`: every element of `a`, `b` and `c` the shapes and strides
    /// reach is inside its allocation, `c`'s strides reach no element twice, and `c` does
    /// not overlap `a` or `b`.
    pub unsafe fn run(&self) {
        let flops = self.m.saturating_mul(self.n).saturating_mul(self.k);
        let by_rows = self.m >= self.n;
        let (extent, across) = if by_rows { (self.m, self.n) } else { (self.n, self.m) };
        let parts = parts(extent, flops, threads());
        let step = extent.div_ceil(parts);
        // Rows (or columns) per block: a block is one `sgemm` call, so blocks of a part are
        // computed exactly as the part would be whole.
        let per_block = (BLOCK_FLOPS / across.saturating_mul(self.k).max(1)).max(MIN_BLOCK);
        let token = crate::cancel::Token::current();
        run_parts(parts, |p| {
            let (lo, hi) = (p * step, ((p + 1) * step).min(extent));
            for start in (lo..hi).step_by(per_block) {
                if token.stop() {
                    return;
                }
                let range = (start, (start + per_block).min(hi));
                let (rows, cols) = if by_rows { (range, (0, self.n)) } else { ((0, self.m), range) };
                // SAFETY: a block of the caller's product; the parts' blocks of `c` are
                // disjoint, and `run_parts` returns only once every part is done.
                unsafe { self.block(rows, cols, &token) }
            }
        });
    }

    /// Rows `m0..m1` and columns `n0..n1` of `c`: one `sgemm` (on AVX-512 hosts, one call per
    /// [`GEMM_KC`] of `k`, through `gemm` where it gives the same bits), or, over a `k` longer
    /// than [`K_BLOCK`] (only zero-stride operands of a compiled kernel reach one), that per
    /// stretch of `k`, accumulated, with a look at `token` between them.
    unsafe fn block(&self, (m0, m1): (usize, usize), (n0, n1): (usize, usize), token: &crate::cancel::Token) {
        let ((a, rsa, csa), (b, rsb, csb), (c, rsc, csc)) = (self.a, self.b, self.c);
        if m0 >= m1 || n0 >= n1 {
            return;
        }
        for k0 in (0..self.k).step_by(K_BLOCK) {
            if k0 > 0 && token.stop() {
                return;
            }
            let k1 = (k0 + K_BLOCK).min(self.k);
            // SAFETY: inside the caller's matrices (see `run`).
            unsafe {
                let (a, b) =
                    (a.offset(m0 as isize * rsa + k0 as isize * csa), b.offset(n0 as isize * csb + k0 as isize * rsb));
                let c = c.offset(m0 as isize * rsc + n0 as isize * csc);
                let (m, k, n) = (m1 - m0, k1 - k0, n1 - n0);
                if vmath::avx512() {
                    for s in (0..k).step_by(GEMM_KC) {
                        let (a, b) = (a.offset(s as isize * csa), b.offset(s as isize * rsb));
                        let kc = GEMM_KC.min(k - s);
                        let accumulate = k0 + s > 0;
                        stretch(
                            Library::for_stretch(m, kc, n, csa, rsb),
                            (m, kc, n),
                            (a, rsa, csa),
                            (b, rsb, csb),
                            (c, rsc, csc),
                            accumulate,
                        );
                    }
                } else {
                    stretch(Library::MatrixMultiply, (m, k, n), (a, rsa, csa), (b, rsb, csb), (c, rsc, csc), k0 > 0);
                }
            }
        }
    }
}

/// `matrixmultiply`'s stretch of `k` for `f32` (its `kc`): on AVX-512 hosts products are cut
/// into stretches this long, each `c (+)= a b` over it, so that an element sums alike in
/// both libraries: one fused multiply-add chain per stretch from zero, then added to `c`.
const GEMM_KC: usize = 256;

/// Which library computes a stretch of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Library {
    MatrixMultiply,
    /// `gemm`'s AVX-512 kernels: 1.05-2x `matrixmultiply`'s on the MLP's and 1000³ products
    /// (Xeon Skylake-SP), with the same bits where its packed kernel runs.
    Gemm,
    /// Ours for results at most one vector wide ([`small_product`]), with the same bits.
    Small,
}

impl Library {
    /// `gemm` where it runs its packed kernel, whose bits are `matrixmultiply`'s; not where it
    /// takes its other paths (`k <= 2`, a row or column vector, or a small result with `a`'s
    /// rows and `b`'s columns contiguous), which sum in another order.
    fn for_stretch(m: usize, k: usize, n: usize, csa: isize, rsb: isize) -> Library {
        if small_product::suits(m, n) {
            return Library::Small;
        }
        let other_path = k <= 2 || m <= 1 || n <= 1 || (m * n <= 256 && csa == 1 && rsb == 1);
        if other_path {
            Library::MatrixMultiply
        } else {
            Library::Gemm
        }
    }
}

/// `c = a b`, or `c += a b` when `accumulate`, for an `m x k` `a`, `k x n` `b` and `m x n` `c`,
/// each a pointer with row and column strides, through `library`.
///
/// # Safety
/// As [`Sgemm::run`].
#[allow(unsafe_code, clippy::type_complexity)]
unsafe fn stretch(
    library: Library,
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (*const f32, isize, isize),
    (b, rsb, csb): (*const f32, isize, isize),
    (c, rsc, csc): (*mut f32, isize, isize),
    accumulate: bool,
) {
    // SAFETY: the caller's.
    unsafe {
        match library {
            Library::MatrixMultiply => {
                let beta = if accumulate { 1.0 } else { 0.0 };
                matrixmultiply::sgemm(m, k, n, 1.0, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
            }
            Library::Small => {
                small_product::product((m, k, n), (a, rsa, csa), (b, rsb, csb), (c, rsc, csc), accumulate)
            }
            // `c = (accumulate ? c : unread) + a b`; gemm takes columns' strides first.
            Library::Gemm => gemm::gemm(
                m,
                n,
                k,
                c,
                csc,
                rsc,
                accumulate,
                a,
                csa,
                rsa,
                b,
                csb,
                rsb,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            ),
        }
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

    /// `c = a b` through [`Sgemm::run`] (on this thread's pool) and by one `matrixmultiply`
    /// call, for an `a` and a `b` each given transposed or not.
    fn both(m: usize, k: usize, n: usize, (a_transposed, b_transposed): (bool, bool)) -> (Vec<f32>, Vec<f32>) {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
        let (rsa, csa) = if a_transposed { (1, m as isize) } else { (k as isize, 1) };
        let (rsb, csb) = if b_transposed { (1, k as isize) } else { (n as isize, 1) };
        let mut split = vec![f32::NAN; m * n];
        let mut direct = vec![f32::NAN; m * n];
        let product = |c: &mut Vec<f32>| Sgemm {
            m,
            k,
            n,
            a: (a.as_ptr(), rsa, csa),
            b: (b.as_ptr(), rsb, csb),
            c: (c.as_mut_ptr(), n as isize, 1),
        };
        // SAFETY: the vectors hold exactly the shapes the strides describe.
        unsafe {
            product(&mut split).run();
            let (a, b, c) = (a.as_ptr(), b.as_ptr(), direct.as_mut_ptr());
            matrixmultiply::sgemm(m, k, n, 1.0, a, rsa, csa, b, rsb, csb, 0.0, c, n as isize, 1);
        }
        (split, direct)
    }

    fn same_bits(x: &[f32], y: &[f32]) -> bool {
        x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn products_through_gemm_are_matrixmultiplys_bits() {
        // On AVX-512 hosts stretches run through `gemm` where its packed kernel does: every
        // shape and layout, those that take its other paths (a vector, k <= 2, a small result
        // from contiguous rows and columns) and `k`s of several stretches among them, sums
        // as one `matrixmultiply` call does.
        let shapes = [(64, 784, 256), (784, 64, 256), (64, 256, 10), (256, 64, 10), (5, 7, 6), (16, 16, 16)];
        let odd = [(1, 100, 300), (300, 100, 1), (2, 100, 100), (100, 2, 100), (33, 513, 65), (17, 258, 40)];
        // Ours: ragged rows and columns, one column, a `k` of several stretches, `k` of 1.
        let narrow = [(37, 300, 10), (8, 5, 16), (300, 100, 1), (19, 600, 15), (64, 1, 10), (9, 2, 3)];
        for (m, k, n) in shapes.into_iter().chain(odd).chain(narrow) {
            for layout in [(false, false), (true, false), (false, true), (true, true)] {
                let (split, direct) = both(m, k, n, layout);
                assert!(same_bits(&split, &direct), "{m}x{k}x{n} transposed {layout:?}");
            }
        }
        let library = |m, k, n, csa, rsb| Library::for_stretch(m, k, n, csa, rsb);
        let gemm = |m, k, n, csa, rsb| library(m, k, n, csa, rsb) == Library::Gemm;
        assert!(gemm(64, 256, 256, 1, 256) && gemm(5, 7, 6, 5, 6) && gemm(20, 20, 20, 1, 1));
        assert!(!gemm(5, 7, 6, 1, 1) && !gemm(1, 9, 9, 9, 9) && !gemm(9, 2, 9, 9, 9));
        // Results one vector wide are ours (`small_product`).
        for (m, k, n) in [(64, 256, 10), (256, 64, 10), (8, 9, 16), (9, 9, 1), (1000, 3, 5)] {
            assert_eq!(library(m, k, n, 1, 1), Library::Small, "{m}x{k}x{n}");
        }
    }

    #[test]
    fn a_split_product_is_bit_for_bit_the_whole_one() {
        use_threads(2, SPIN).unwrap();
        assert_eq!(threads(), 2);
        // Split by rows, by columns (more columns than rows), with a transposed operand,
        // with ragged parts; and a small one that stays whole.
        for (m, k, n, t) in [(600, 300, 500, false), (40, 2000, 700, false), (513, 257, 301, true), (8, 8, 8, false)] {
            let (split, direct) = both(m, k, n, (t, false));
            assert!(same_bits(&split, &direct), "{m}x{k}x{n}");
            assert!(split.iter().any(|&x| x != 0.0));
        }
        assert_eq!((parts(600, 90_000_000, 2), parts(40, 56_000_000, 2), parts(8, 512, 2)), (2, 1, 1));
        assert_eq!(parts(700, 56_000_000, 2), 2);
        use_threads(1, SPIN).unwrap();
        assert_eq!(threads(), 1);
    }

    #[test]
    fn every_part_runs_once_and_a_panicking_part_reaches_the_caller() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use_threads(3, SPIN).unwrap();
        let runs: Vec<AtomicUsize> = (0..7).map(|_| AtomicUsize::new(0)).collect();
        run_parts(7, |i| {
            runs[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        // A panic in a part (on the team's thread or this one) unwinds here, after the
        // other parts ran, instead of aborting the process.
        let done = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_parts(4, |i| {
                assert_ne!(i, 2, "part 2 fails");
                done.fetch_add(1, Ordering::Relaxed);
            })
        }));
        let message = caught.expect_err("the panic reaches the caller");
        assert!(message.downcast_ref::<String>().is_some_and(|m| m.contains("part 2 fails")));
        assert_eq!(done.load(Ordering::Relaxed), 3);
        // The team still works afterwards.
        run_parts(2, |i| {
            runs[i].fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(runs[1].load(Ordering::Relaxed), 2);
        use_threads(1, SPIN).unwrap();
    }

    #[test]
    fn elementwise_ops_give_the_same_bits_split() {
        use crate::backend::cpu::interp::{binary, unary};
        use gt_ir::{BinaryOp, UnaryOp};
        // Contiguous operands split over the team from TEAM_MIN_ELEMENTS (a vector function,
        // a plain map, both operands whole, one a scalar); broadcast ones over the rayon
        // pool from PARALLEL_MIN_ELEMENTS.
        for n in [TEAM_MIN_ELEMENTS + 17, PARALLEL_MIN_ELEMENTS * 3 + 17] {
            let x = ndarray::ArrayD::from_shape_fn(vec![n], |i| (i[0] % 1013) as f32 / 101.0 - 5.0);
            let z = ndarray::ArrayD::from_shape_fn(vec![n], |i| (i[0] % 97) as f32 / 7.0 - 3.0);
            let y = ndarray::ArrayD::from_shape_fn(vec![1], |_| 0.75f32);
            let rows = ndarray::ArrayD::from_shape_fn(vec![n / 16, 16], |i| i[0] as f32 - i[1] as f32);
            let row = ndarray::ArrayD::from_shape_fn(vec![16], |i| i[0] as f32 * 0.5);
            let run = || {
                [
                    unary(UnaryOp::Tanh, &x),
                    unary(UnaryOp::Relu, &z),
                    binary(BinaryOp::Pow, &x.view(), &y.view(), &[n]),
                    binary(BinaryOp::Sub, &x.view(), &z.view(), &[n]),
                    binary(BinaryOp::Mul, &y.view(), &z.view(), &[n]),
                    binary(BinaryOp::Add, &rows.view(), &row.view(), &[n / 16, 16]),
                ]
            };
            use_threads(1, SPIN).unwrap();
            let alone = run();
            use_threads(2, SPIN).unwrap();
            let split = run();
            use_threads(1, SPIN).unwrap();
            let bits =
                |t: &ndarray::ArrayD<f32>| (t.shape().to_vec(), t.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            for (k, (s, a)) in split.iter().zip(&alone).enumerate() {
                assert_eq!(bits(s), bits(a), "op {k} of {n} elements");
            }
        }
    }
}
