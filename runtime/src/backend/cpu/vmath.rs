//! The fused kernels' polynomial `exp`, `log`, `tanh`, `sigmoid` and `erf`
//! (`jit/math.rs`) as Rust loops over slices that the compiler vectorizes, for the
//! interpreter's `f32` ops: libm's scalar calls cost 10-20 ns an element, these about one.
//!
//! Every function here is the same sequence of IEEE operations as its CLIF twin, with fused
//! multiply-adds exactly where the JIT uses them (on hosts with FMA, detected at run time as
//! Cranelift detects it), so an op gives the same bits interpreted and fused. Accuracy (within
//! 2 ulp of libm) and special values are described and tested in `jit/math.rs`; the tests
//! here hold the two implementations to each other.
//!
//! `f64`'s transcendental functions are `gt_ir::math64`'s, here in loops of the host's
//! widest vectors ([`map_f64`]: eight lanes with AVX-512, where libm took 3-8 ns an element),
//! with the bits of `apply_f64` at every width.

use gt_ir::UnaryPrim;

/// An op over a slice: `out[i] = f(x[i])`, `out.len() == x.len()`.
pub type SliceFn = fn(&[f32], &mut [f32]);

/// The vector loop for `op`, where it is one of the polynomial functions.
pub fn slice_fn(op: UnaryPrim) -> Option<SliceFn> {
    Some(match op {
        UnaryPrim::Exp => map_exp,
        UnaryPrim::Log => map_log,
        UnaryPrim::Tanh => map_tanh,
        UnaryPrim::Sigmoid => map_sigmoid,
        UnaryPrim::Erf => map_erf,
        _ => return None,
    })
}

/// Runs `body` inlined into a function built for the host's widest vectors (AVX-512: sixteen
/// lanes; AVX2: eight) and FMA where the host has them, so the loops in it are vectorized that
/// wide. Plain IEEE operations give the same bits at any width (Rust never fuses a multiply
/// and an add on its own).
#[inline(always)]
pub fn wide<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
        #[inline]
        fn avx512<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        #[target_feature(enable = "avx2,fma")]
        #[inline]
        fn avx2<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        match host_level() {
            // SAFETY: the host has the features these are built for.
            #[allow(unsafe_code)]
            3 => return unsafe { avx512(body) },
            #[allow(unsafe_code)]
            2 => return unsafe { avx2(body) },
            _ => {}
        }
    }
    body()
}

/// Which loop the host runs: 0 the baseline (no fused multiply-adds), 1 FMA (as Cranelift
/// decides for the JIT), 2 FMA with AVX2's 8-lane integer ops, 3 AVX-512 (sixteen lanes; on
/// a 2-core Xeon VM 1.7x AVX2's speed for `tanh`, 2.1x for `exp`).
fn host_level() -> u8 {
    static LEVEL: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx512 = has!("avx512f") && has!("avx512vl") && has!("avx512dq") && has!("avx512bw");
            match (has!("fma"), has!("avx2"), avx512) {
                (true, true, true) if std::env::var_os("GT_AVX512").is_none_or(|v| v != "0") => 3,
                (true, true, _) => 2,
                (true, false, _) => 1,
                (false, _, _) => 0,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            0
        }
    })
}

/// A half type's conversions of whole slices to and from `f32` (exact one way, rounded to
/// nearest even the other, NaNs kept quiet: `half`'s rules).
pub trait Halves: Sized + Copy {
    /// `dst[i] = src[i]` as `f32`.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = src[i]` rounded.
    fn narrow(src: &[f32], dst: &mut [Self]);
}

/// `half`'s slice conversions (F16C's instructions where the CPU has them).
impl Halves for half::f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
}

/// Loops the compiler vectorizes, with `half`'s bits: its slice conversions call the
/// branchy scalar conversion per element for `bf16` (about a nanosecond each, a third of an
/// eager `bf16` product's time in the MLP step).
impl Halves for half::bf16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        wide(|| {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f32::from_bits(u32::from(s.to_bits()) << 16);
            }
        });
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len());
        wide(|| {
            for (d, &x) in dst.iter_mut().zip(src) {
                let bits = x.to_bits();
                // Adding just under half an ulp, plus the kept part's lowest bit, carries
                // exactly when rounding to nearest even goes up (to infinity past the
                // largest finite value, as it should).
                let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
                let quiet_nan = (bits >> 16) as u16 | 0x0040;
                *d = half::bf16::from_bits(if bits & 0x7fff_ffff > 0x7f80_0000 { quiet_nan } else { rounded });
            }
        });
    }
}

/// The levels with fused multiply-adds that this host can run (1 up to [`host_level`]), for
/// tests that hold each to the JIT's bits.
#[cfg(test)]
pub(crate) fn fma_levels() -> std::ops::RangeInclusive<u8> {
    1..=host_level()
}

/// Whether CPU work runs AVX-512 code on this host (it has it, and `GT_AVX512` is not `0`):
/// these loops sixteen lanes wide, and products through `gemm`'s AVX-512 kernels.
pub fn avx512() -> bool {
    host_level() == 3
}

/// Whether the loops use fused multiply-adds on this host (the JIT's `fma` flag agrees).
pub fn uses_fma() -> bool {
    host_level() > 0
}

/// One entry point per function: the loop compiled for the host's vector features, fused
/// multiply-adds where the host has them (the JIT's choice too), else the build's baseline;
/// `at_level` holds each level's loop, so tests can hold every level the host can run to the
/// JIT's bits.
macro_rules! slice_fns {
    ($($prim:ident: $map:ident => $scalar:ident,)*) => {
        $(
            fn $map(x: &[f32], out: &mut [f32]) {
                at_level::$map(host_level(), x, out)
            }
        )*

        mod at_level {
            use super::*;
            $(
                /// The loop at `level` ([`host_level`]'s numbering), which the host must have.
                pub(super) fn $map(level: u8, x: &[f32], out: &mut [f32]) {
                    assert_eq!(x.len(), out.len());
                    assert!(level <= host_level(), "level {level} is past the host's {}", host_level());
                    #[cfg(target_arch = "x86_64")]
                    {
                        #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
                        fn avx512(x: &[f32], out: &mut [f32]) {
                            for (o, &x) in out.iter_mut().zip(x) {
                                *o = $scalar::<true>(x);
                            }
                        }
                        #[target_feature(enable = "avx2,fma")]
                        fn avx2(x: &[f32], out: &mut [f32]) {
                            for (o, &x) in out.iter_mut().zip(x) {
                                *o = $scalar::<true>(x);
                            }
                        }
                        #[target_feature(enable = "fma")]
                        fn fma(x: &[f32], out: &mut [f32]) {
                            for (o, &x) in out.iter_mut().zip(x) {
                                *o = $scalar::<true>(x);
                            }
                        }
                        match level {
                            // SAFETY: the host has the features these are compiled for (the
                            // assertion above).
                            #[allow(unsafe_code)]
                            3 => return unsafe { avx512(x, out) },
                            #[allow(unsafe_code)]
                            2 => return unsafe { avx2(x, out) },
                            #[allow(unsafe_code)]
                            1 => return unsafe { fma(x, out) },
                            _ => {}
                        }
                    }
                    for (o, &x) in out.iter_mut().zip(x) {
                        *o = $scalar::<false>(x);
                    }
                }
            )*
        }

        /// `op`'s loop at `level` (at most the host's, [`host_levels`]), for tests.
        #[cfg(test)]
        pub(crate) fn slice_fn_at(op: UnaryPrim) -> Option<fn(u8, &[f32], &mut [f32])> {
            Some(match op {
                $(UnaryPrim::$prim => at_level::$map,)*
                _ => return None,
            })
        }
    };
}

slice_fns! {
    Exp: map_exp => exp,
    Log: map_log => log,
    Tanh: map_tanh => tanh,
    Sigmoid: map_sigmoid => sigmoid,
    Erf: map_erf => erf,
}

/// Where a loop puts an `f32` result (a random number): an element already written, one
/// not yet, or an `f64` (widened).
pub trait PutF32 {
    /// Writes `x` here.
    fn put(&mut self, x: f32);
}

impl PutF32 for f32 {
    #[inline(always)]
    fn put(&mut self, x: f32) {
        *self = x;
    }
}

impl PutF32 for f64 {
    #[inline(always)]
    fn put(&mut self, x: f32) {
        *self = f64::from(x);
    }
}

impl PutF32 for std::mem::MaybeUninit<f32> {
    #[inline(always)]
    fn put(&mut self, x: f32) {
        self.write(x);
    }
}

/// `out[j]` = element `first + j` of `randn` (`random::normal`) or `rand`
/// (`random::uniform`) with this seed, the same bits, in a loop built for the host's widest
/// vectors: `math64`'s `ln` and `cos` and the 64-bit mixing in lanes (where libm's scalar
/// `ln` and `cos` took about 50 ns an element).
pub fn random_into<P: PutF32>(kind: RandomKind, seed: u64, first: u64, out: &mut [P]) {
    random_at(host_level(), kind, seed, first, out);
}

/// Which generator a fill runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomKind {
    /// `random::normal`.
    Normal,
    /// `random::uniform`.
    Uniform,
}

/// [`normal_into`] or [`uniform_into`] in the loop built for `level` ([`host_level`]'s
/// numbering), which the host must have.
pub(crate) fn random_at<P: PutF32>(level: u8, kind: RandomKind, seed: u64, first: u64, out: &mut [P]) {
    use gt_ir::random;
    assert!(level <= host_level(), "level {level} is past the host's {}", host_level());
    let mixed = random::splitmix64(seed);
    // As in `map_f64_at`: the loop is written out in each function built for a level.
    macro_rules! fill {
        ($kind:ident, $mixed:ident, $first:ident, $out:ident) => {
            match $kind {
                RandomKind::Normal => {
                    for (j, o) in $out.iter_mut().enumerate() {
                        o.put(random::normal_mixed($mixed, $first.wrapping_add(j as u64)));
                    }
                }
                RandomKind::Uniform => {
                    for (j, o) in $out.iter_mut().enumerate() {
                        o.put(random::uniform_mixed($mixed, $first.wrapping_add(j as u64)));
                    }
                }
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
        fn avx512<P: PutF32>(kind: RandomKind, mixed: u64, first: u64, out: &mut [P]) {
            fill!(kind, mixed, first, out);
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2<P: PutF32>(kind: RandomKind, mixed: u64, first: u64, out: &mut [P]) {
            fill!(kind, mixed, first, out);
        }
        #[target_feature(enable = "fma")]
        fn fma<P: PutF32>(kind: RandomKind, mixed: u64, first: u64, out: &mut [P]) {
            fill!(kind, mixed, first, out);
        }
        match level {
            // SAFETY: the host has the features these are built for (asserted).
            #[allow(unsafe_code)]
            3 => return unsafe { avx512(kind, mixed, first, out) },
            #[allow(unsafe_code)]
            2 => return unsafe { avx2(kind, mixed, first, out) },
            #[allow(unsafe_code)]
            1 => return unsafe { fma(kind, mixed, first, out) },
            _ => {}
        }
    }
    fill!(kind, mixed, first, out);
}

/// Where a loop puts an `f64` result: an element already written, or one not yet.
pub trait PutF64 {
    /// Writes `x` here.
    fn put(&mut self, x: f64);
}

impl PutF64 for f64 {
    #[inline(always)]
    fn put(&mut self, x: f64) {
        *self = x;
    }
}

impl PutF64 for std::mem::MaybeUninit<f64> {
    #[inline(always)]
    fn put(&mut self, x: f64) {
        self.write(x);
    }
}

/// Whether [`map_f64`] takes `op`: `f64`'s transcendental functions.
pub fn is_costly_f64(op: UnaryPrim) -> bool {
    matches!(op, UnaryPrim::Exp | UnaryPrim::Log | UnaryPrim::Tanh | UnaryPrim::Sigmoid | UnaryPrim::Erf)
}

/// `out[i] = op(x[i])` for `f64`'s transcendental functions ([`is_costly_f64`]; false for
/// another op): `gt_ir::math64`'s code, which `apply_f64` runs one element at a time, here
/// in a loop built for the host's widest vectors and fused multiply-adds, the same bits at
/// any width (a multiply-add rounds once everywhere).
pub fn map_f64<P: PutF64>(op: UnaryPrim, x: &[f64], out: &mut [P]) -> bool {
    map_f64_at(host_level(), op, x, out)
}

/// [`map_f64`] in the loop built for `level` ([`host_level`]'s numbering), which the host
/// must have.
fn map_f64_at<P: PutF64>(level: u8, op: UnaryPrim, x: &[f64], out: &mut [P]) -> bool {
    assert_eq!(x.len(), out.len());
    assert!(level <= host_level(), "level {level} is past the host's {}", host_level());
    // The loop is written out in each function built for a level: a closure called from
    // one is not inlined into it, and its multiply-adds become calls.
    macro_rules! at_host_level {
        ($f:ident) => {{
            use gt_ir::math64::{$f, Lane};
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
                fn avx512<P: PutF64>(x: &[f64], out: &mut [P]) {
                    for (o, &x) in out.iter_mut().zip(x) {
                        o.put($f(&mut Lane, &x));
                    }
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2<P: PutF64>(x: &[f64], out: &mut [P]) {
                    for (o, &x) in out.iter_mut().zip(x) {
                        o.put($f(&mut Lane, &x));
                    }
                }
                #[target_feature(enable = "fma")]
                fn fma<P: PutF64>(x: &[f64], out: &mut [P]) {
                    for (o, &x) in out.iter_mut().zip(x) {
                        o.put($f(&mut Lane, &x));
                    }
                }
                match level {
                    // SAFETY: the host has the features these are built for (asserted).
                    #[allow(unsafe_code)]
                    3 => {
                        unsafe { avx512(x, out) };
                        return true;
                    }
                    #[allow(unsafe_code)]
                    2 => {
                        unsafe { avx2(x, out) };
                        return true;
                    }
                    #[allow(unsafe_code)]
                    1 => {
                        unsafe { fma(x, out) };
                        return true;
                    }
                    _ => {}
                }
            }
            for (o, &x) in out.iter_mut().zip(x) {
                o.put($f(&mut Lane, &x));
            }
        }};
    }
    match op {
        UnaryPrim::Exp => at_host_level!(exp),
        UnaryPrim::Log => at_host_level!(ln),
        UnaryPrim::Tanh => at_host_level!(tanh),
        UnaryPrim::Sigmoid => at_host_level!(sigmoid),
        UnaryPrim::Erf => at_host_level!(erf),
        _ => return false,
    }
    true
}

/// Cephes' polynomial for `e^r - 1 - r` over `r^2` on `|r| <= ln2 / 2`, highest power first
/// (shared with `jit/math.rs`).
pub(super) const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5e-1];
/// Cephes' polynomial for `log(1 + m)` (over `m^3`) on the folded mantissa.
pub(super) const LOG_P: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_4e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];
/// Cephes' odd polynomial for `tanh` below `|x| = 0.625` (in `x^2`).
pub(super) const TANH_P: [f32; 5] = [-5.704_988_7e-3, 2.063_909e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328e-1];

/// `p(x)` by Horner's rule, highest power first, fused as the JIT's `horner`.
#[inline(always)]
fn horner<const FMA: bool>(x: f32, coefficients: &[f32]) -> f32 {
    let mut p = coefficients[0];
    for &c in &coefficients[1..] {
        p = if FMA { p.mul_add(x, c) } else { p * x + c };
    }
    p
}

/// `mask ? t : f`, branch-free so the loop vectorizes.
#[inline(always)]
fn select(mask: bool, t: f32, f: f32) -> f32 {
    if mask {
        t
    } else {
        f
    }
}

/// `2^n` for `-126 <= n <= 127`, built in the exponent bits.
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits((n.wrapping_add(127) << 23) as u32)
}

/// `e^x` (`Emit::exp`).
#[inline(always)]
pub fn exp<const FMA: bool>(x: f32) -> f32 {
    // Comparisons are false for NaN, which passes through both clamps. Below -104 the result
    // rounds to +0: it is computed from 0 and replaced, since computing it from -104 makes a
    // subnormal on the way, which x86 handles by a microcode assist (a masked softmax, half its
    // elements at -1e30, ran 3x slower).
    let dead = x < -104.0;
    let x = select(dead, 0.0, x);
    let x = select(x > 89.0, 89.0, x);
    let magic = 12_582_912.0f32;
    let t = x * std::f32::consts::LOG2_E + magic;
    let nf = t - magic;
    let n = (t.to_bits() as i32).wrapping_sub(magic.to_bits() as i32);
    let r = x - nf * 0.693_359_4;
    let r = r - nf * -2.121_944_4e-4;
    let z = r * r;
    let p = horner::<FMA>(r, &EXP_P);
    let y = p * z + r + 1.0;
    let n1 = n >> 1;
    let n2 = n.wrapping_sub(n1);
    select(dead, 0.0, y * pow2(n1) * pow2(n2))
}

/// Natural logarithm (`Emit::log`).
#[inline(always)]
pub fn log<const FMA: bool>(x0: f32) -> f32 {
    let sub = x0 < f32::MIN_POSITIVE;
    let x = select(sub, x0 * 8_388_608.0, x0);
    let bits = x.to_bits() as i32;
    let e = ((bits as u32) >> 23) as i32 - 126 - if sub { 23 } else { 0 };
    let m = f32::from_bits(((bits & 0x007f_ffff) | 0x3f00_0000) as u32);
    let small = m < std::f32::consts::FRAC_1_SQRT_2;
    let e = e - i32::from(small);
    let m = select(small, m + m, m) - 1.0;
    let ef = e as f32;
    let z = m * m;
    let y = horner::<FMA>(m, &LOG_P);
    let y = y * m * z;
    let y = y + ef * -2.121_944_4e-4;
    let y = y + z * -0.5;
    let r = m + y + ef * 0.693_359_4;
    // Special values, last wins: inf, zeros, negatives, NaN.
    let r = select(x0 == f32::INFINITY, f32::INFINITY, r);
    let r = select(x0 == 0.0, f32::NEG_INFINITY, r);
    let r = select(x0 < 0.0, f32::NAN, r);
    select(x0.is_nan(), x0, r)
}

/// Hyperbolic tangent (`Emit::tanh`).
#[inline(always)]
pub fn tanh<const FMA: bool>(x: f32) -> f32 {
    let ax = x.abs();
    let z = x * x;
    let p = horner::<FMA>(z, &TANH_P);
    let small = p * z * x + x;
    let e = exp::<FMA>(ax + ax);
    let big = 1.0 - 2.0 / (e + 1.0);
    let big = f32::from_bits(big.to_bits() | (x.to_bits() & 0x8000_0000));
    select(ax < 0.625, small, big)
}

/// The logistic function (`Emit::sigmoid`).
#[inline(always)]
pub fn sigmoid<const FMA: bool>(x: f32) -> f32 {
    let e = exp::<FMA>(-x.abs());
    let d = e + 1.0;
    select(x < 0.0, e / d, 1.0 / d)
}

/// `erf(x)` (`Emit::erf`): Eigen's rational function on `x` clamped to `[-4, 4]`, its
/// result clamped to `[-1, 1]` (the fit overshoots 1 by an ulp near 4).
#[inline(always)]
pub fn erf<const FMA: bool>(x: f32) -> f32 {
    use gt_ir::ops::{ERF_DENOMINATOR as Q, ERF_NUMERATOR as P};
    let x = select(x > 4.0, 4.0, x);
    let x = select(x < -4.0, -4.0, x);
    let x2 = x * x;
    let r = horner::<FMA>(x2, &P) / horner::<FMA>(x2, &Q) * x;
    let r = select(r > 1.0, 1.0, r);
    select(r < -1.0, -1.0, r)
}

#[cfg(test)]
mod tests {
    /// The vector loops of `f64`'s transcendental functions give `apply_f64`'s bits (one
    /// element at a time) at every level this host runs, the baseline's too, over special
    /// values, every range their cases split at, and lengths with vector tails.
    #[test]
    fn f64_loops_give_the_scalar_bits_at_every_level() {
        use gt_ir::UnaryPrim;
        let mut xs: Vec<f64> = vec![0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 5e-324, f64::MAX, -f64::MAX];
        for i in 0..4000u64 {
            let u = (gt_ir::random::splitmix64(i) >> 11) as f64 / (1u64 << 53) as f64;
            xs.extend([(u - 0.5) * 1600.0, (u - 0.5) * 16.0, u * 1e-6, -(u * 2.0), 2f64.powf(u * 2098.0 - 1074.0)]);
        }
        let mut ops = 0;
        for op in UnaryPrim::ALL.iter().copied().filter(|&op| super::is_costly_f64(op)) {
            let want: Vec<u64> = xs.iter().map(|&x| op.apply_f64(x).to_bits()).collect();
            for level in 0..=super::host_level() {
                for len in [xs.len(), 1, 7, 13] {
                    let mut out = vec![0.0; len];
                    assert!(super::map_f64_at(level, op, &xs[..len], &mut out));
                    for (i, o) in out.iter().enumerate() {
                        let same = o.to_bits() == want[i] || (o.is_nan() && f64::from_bits(want[i]).is_nan());
                        assert!(
                            same,
                            "{op:?}({:e}) at level {level}: {o:e}, one at a time {:e}",
                            xs[i],
                            f64::from_bits(want[i])
                        );
                    }
                }
            }
            ops += 1;
        }
        assert_eq!(ops, 5);
        assert!(!super::map_f64(UnaryPrim::Sqrt, &[1.0], &mut [0.0]));
    }

    /// `bf16`'s vector conversions give `half`'s bits: every upper half with the lower
    /// halves where rounding turns (ties either way, just below, just above), so every
    /// exponent, both signs, infinities and NaNs.
    /// The vector fills of `randn` and `rand` give `gt_ir::random`'s scalar bits at every
    /// level this host runs, from any first element (a tile's, a thread's stretch's), into
    /// `f32`s and widened into `f64`s.
    #[test]
    fn random_fills_give_the_scalar_bits_at_every_level() {
        use super::{random_at, RandomKind};
        use gt_ir::random;
        for level in 0..=super::host_level() {
            for (first, len) in [(0u64, 1000usize), (7, 33), (1 << 40, 517), (u64::MAX - 20, 20)] {
                let mut normal = vec![0.0f32; len];
                let mut uniform = vec![0.0f64; len];
                random_at(level, RandomKind::Normal, 42, first, &mut normal);
                random_at(level, RandomKind::Uniform, 42, first, &mut uniform);
                for j in 0..len {
                    let i = first + j as u64;
                    assert_eq!(
                        normal[j].to_bits(),
                        random::normal(42, i).to_bits(),
                        "level {level}, randn element {i}"
                    );
                    assert_eq!(uniform[j], f64::from(random::uniform(42, i)), "level {level}, rand element {i}");
                }
            }
        }
    }

    #[test]
    fn bf16_conversions_give_halfs_bits() {
        use super::Halves;
        let floats: Vec<f32> = (0..=u16::MAX)
            .flat_map(|hi| [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff].map(|lo| f32::from_bits(u32::from(hi) << 16 | lo)))
            .collect();
        let mut ours = vec![half::bf16::ZERO; floats.len()];
        half::bf16::narrow(&floats, &mut ours);
        for (x, b) in floats.iter().zip(&ours) {
            assert_eq!(b.to_bits(), half::bf16::from_f32(*x).to_bits(), "{:#010x}", x.to_bits());
        }
        let mut back = vec![0.0f32; ours.len()];
        half::bf16::widen(&ours, &mut back);
        for (b, x) in ours.iter().zip(&back) {
            assert_eq!(x.to_bits(), b.to_f32().to_bits(), "{:#06x}", b.to_bits());
        }
    }
}
