//! Matrix products too small or too narrow for `gemm`'s packed tiles (the MLP's `64x256x10`
//! and its gradients): the right operand packed once into rows of whole vectors, each block
//! of eight rows and one vector of columns summed in registers. Every element is one fused
//! multiply-add chain over its stretch of `k` from zero, then stored (or added to `c`), which
//! is how `gemm`'s and `matrixmultiply`'s packed kernels sum it: the same bits, faster.

use crate::backend::cpu::vmath;

/// Columns per vector (one AVX-512 register of `f32`).
const LANES: usize = 16;

/// Rows summed together: eight independent chains per column vector keep both FMA units busy
/// (four cycles of latency each).
const ROWS: usize = 8;

/// Whether a stretch of a product runs here rather than through `gemm`: a result one vector
/// wide or narrower (`gemm`'s tiles are 48 to 64 columns wide, so 10 columns waste most of
/// each) with rows enough for a block. Measured one thread warm on the Xeon VM
/// (`sgemm`-shaped probe, best of 5): 64x256x10 8.8 -> 4.9 µs, 256x64x10 (`a` transposed)
/// 7.7 -> 4.9 µs, 8x256x10 3.7 -> 1.7 µs, 1000x1000x10 385 -> 294 µs; two columns' worth
/// (256x256x32) and fewer rows than a block (1x784x10, 3x100x5) are `gemm`'s.
pub(crate) fn suits(m: usize, n: usize) -> bool {
    n <= LANES && m >= ROWS
}

/// `c = a b`, or `c += a b` when `accumulate`, for an `m x k` `a`, `k x n` `b` and `m x n` `c`,
/// each a pointer with row and column strides, in AVX-512 vectors: `Sgemm` chooses it
/// ([`suits`]) only on hosts that have them, and it panics on others.
///
/// # Safety
/// As [`super::threads::Sgemm::run`]: every element the shapes and strides reach is inside
/// its allocation, `c`'s strides reach no element twice, and `c` does not overlap `a` or `b`.
#[allow(unsafe_code)]
pub(crate) unsafe fn product(
    (m, k, n): (usize, usize, usize),
    a: (*const f32, isize, isize),
    (b, rsb, csb): (*const f32, isize, isize),
    c: (*mut f32, isize, isize),
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    // `b` row by row, each padded with zeros to whole vectors (the padding's sums are dropped).
    let width = n.div_ceil(LANES) * LANES;
    let mut packed = vec![0f32; k * width];
    for (kk, row) in packed.chunks_exact_mut(width).enumerate() {
        for (j, x) in row[..n].iter_mut().enumerate() {
            // SAFETY: inside `b` (the caller's).
            *x = unsafe { *b.offset(kk as isize * rsb + j as isize * csb) };
        }
    }
    let block = Block { k, n, width, packed: &packed, a, c, accumulate };
    #[cfg(target_arch = "x86_64")]
    if vmath::avx512() {
        // SAFETY: the host has AVX-512; the rows are the caller's.
        return unsafe { block.all_avx512(m) };
    }
    unreachable!("`Sgemm` chooses the small-product kernel only on hosts with AVX-512")
}

/// What each block of rows reads and writes.
#[derive(Clone, Copy)]
struct Block<'p> {
    k: usize,
    n: usize,
    width: usize,
    packed: &'p [f32],
    a: (*const f32, isize, isize),
    c: (*mut f32, isize, isize),
    accumulate: bool,
}

impl Block<'_> {
    /// Every row of `c`, in AVX-512 vectors.
    ///
    /// # Safety
    /// The host has AVX-512; `m` rows are inside `a` and `c`.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    unsafe fn all_avx512(&self, m: usize) {
        let whole = m - m % ROWS;
        for i in (0..whole).step_by(ROWS) {
            // SAFETY: rows `i..i + ROWS` are inside `a` and `c` (the caller's).
            unsafe { self.rows_avx512::<ROWS>(i) };
        }
        for i in whole..m {
            // SAFETY: as above, for row `i`.
            unsafe { self.rows_avx512::<1>(i) };
        }
    }

    /// Rows `i0..i0 + R` of `c`, a vector of columns at a time, in AVX-512 registers.
    ///
    /// # Safety
    /// The host has AVX-512; those rows are inside `a` and `c`.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn rows_avx512<const R: usize>(&self, i0: usize) {
        use std::arch::x86_64::{
            __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps,
            _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
        };
        let ((a, rsa, csa), (c, rsc, csc)) = (self.a, self.c);
        for j0 in (0..self.width).step_by(LANES) {
            let mut acc: [__m512; R] = [_mm512_setzero_ps(); R];
            for kk in 0..self.k {
                // SAFETY: `packed` holds `k` rows of `width`, a multiple of LANES past `j0`;
                // row `i0 + r`, column `kk` of `a` is the caller's.
                unsafe {
                    let b = _mm512_loadu_ps(self.packed.as_ptr().add(kk * self.width + j0));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let x = _mm512_set1_ps(*a.offset((i0 + r) as isize * rsa + kk as isize * csa));
                        *acc = _mm512_fmadd_ps(x, b, *acc);
                    }
                }
            }
            let live = LANES.min(self.n - j0);
            for (r, &sum) in acc.iter().enumerate() {
                let row = (i0 + r) as isize * rsc;
                // SAFETY: columns `j0..j0 + live` (< n) of row `i0 + r` of `c` are the caller's;
                // the mask keeps the others untouched.
                unsafe {
                    if csc == 1 {
                        let p = c.offset(row + j0 as isize);
                        let mask = (u32::MAX >> (32 - live)) as u16;
                        let sum =
                            if self.accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), sum) } else { sum };
                        _mm512_mask_storeu_ps(p, mask, sum);
                    } else {
                        let mut lanes = [0f32; LANES];
                        _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
                        for (l, &s) in lanes[..live].iter().enumerate() {
                            let p = c.offset(row + (j0 + l) as isize * csc);
                            *p = if self.accumulate { *p + s } else { s };
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    #[test]
    fn a_strided_result_and_accumulation_give_matrixmultiplys_bits() {
        // The kernel runs on AVX-512 hosts only (`Sgemm` chooses it nowhere else).
        if !vmath::avx512() {
            return;
        }
        for (m, k, n) in [(37, 300, 10), (8, 7, 16), (24, 3, 1)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
            let start: Vec<f32> = (0..m * n).map(|i| (i % 11) as f32 * 0.25 - 1.0).collect();
            // `c` column-major (its rows one element apart), summed onto what it holds.
            let (rsc, csc) = (1, m as isize);
            let (mut ours, mut theirs) = (start.clone(), start);
            // SAFETY: the vectors hold exactly the shapes the strides describe.
            unsafe {
                let (a, b) = ((a.as_ptr(), k as isize, 1), (b.as_ptr(), n as isize, 1));
                // As `Sgemm::block` calls it: a stretch of 256 (`matrixmultiply`'s) at a time.
                for s in (0..k).step_by(256) {
                    let (a, b) = ((a.0.add(s), a.1, a.2), (b.0.add(s * n), b.1, b.2));
                    product((m, 256.min(k - s), n), a, b, (ours.as_mut_ptr(), rsc, csc), true);
                }
                let c = theirs.as_mut_ptr();
                matrixmultiply::sgemm(m, k, n, 1.0, a.0, a.1, a.2, b.0, b.1, b.2, 1.0, c, rsc, csc);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&theirs), "{m}x{k}x{n}");
        }
    }
}
