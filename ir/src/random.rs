//! The counter-based RNG behind `randn` and `rand`: element `i` of a tensor depends only on
//! the seed and `i`, so any backend (a GPU thread per element, a shard of a tensor)
//! reproduces the interpreter's values exactly, in any order. It lives here, in the crate
//! every other one depends on, so that the interpreter, the kernel oracle, the JIT, the PTX
//! generator and the frontend's seed sequence share one copy.
//!
//! # Algorithm
//!
//! All integer arithmetic is on `u64`, wrapping.
//!
//! - `splitmix64(x)`: `z = x + 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//!   z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31)`.
//! - `bits(seed, i) = splitmix64(splitmix64(seed) + i)`.
//! - `uniform(seed, i) = (bits(seed, i) >> 40) * 2^-24`, an `f32` in `[0, 1)` (exact: 24 bits).
//! - `normal(seed, i)`: Box-Muller in `f64` over the counters `2i` and `2i + 1`:
//!   `u1 = (bits(seed, 2i) >> 11) * 2^-53`, `u2 = (bits(seed, 2i + 1) >> 11) * 2^-53`,
//!   `r = sqrt(-2 ln(1 - u1))`, value `r * cos(2 pi u2)` rounded to `f32` (`1 - u1` is in
//!   `(0, 1]`, so the logarithm is finite). `ln` and `cos` are [`crate::math64`]'s, not the
//!   platform's libm: every backend computes the same bits by construction (the PTX emits
//!   the same operations), and a CPU computes them in vector lanes ([`normal_mixed`] is the
//!   loop body of `gt-runtime`'s bulk fill).
//!
//! Element `i` (row-major) of `rand` is `uniform(seed, i)`; of `randn`, `normal(seed, i)`.

use crate::math64;

/// 2^-24: scales 24 random bits into `[0, 1)`.
const F32_UNIT: f32 = 1.0 / 16_777_216.0;
/// 2^-53: scales 53 random bits into `[0, 1)`.
const F64_UNIT: f64 = 1.0 / 9_007_199_254_740_992.0;

/// The SplitMix64 finaliser: a bijective mix of 64 bits.
#[inline(always)]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for counter `i` of stream `seed`.
pub fn bits(seed: u64, i: u64) -> u64 {
    splitmix64(splitmix64(seed).wrapping_add(i))
}

/// Element `i` of `rand` with this seed: uniform in `[0, 1)`.
pub fn uniform(seed: u64, i: u64) -> f32 {
    uniform_mixed(splitmix64(seed), i)
}

/// [`uniform`] given `splitmix64(seed)`.
#[inline(always)]
pub fn uniform_mixed(mixed: u64, i: u64) -> f32 {
    // 24 bits fit an f32 mantissa exactly, so the result is never rounded up to 1.0.
    (splitmix64(mixed.wrapping_add(i)) >> 40) as f32 * F32_UNIT
}

/// Element `i` of `randn` with this seed: standard normal (Box-Muller on counters `2i`, `2i+1`).
pub fn normal(seed: u64, i: u64) -> f32 {
    let mixed = splitmix64(seed);
    #[cfg(target_arch = "x86_64")]
    {
        // `math64`'s multiply-adds are one instruction with FMA, a libm call without.
        #[target_feature(enable = "fma")]
        fn with_fma(mixed: u64, i: u64) -> f32 {
            normal_mixed(mixed, i)
        }
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the feature the function is built for.
            #[allow(unsafe_code)]
            return unsafe { with_fma(mixed, i) };
        }
    }
    normal_mixed(mixed, i)
}

/// [`normal`] given `splitmix64(seed)`: branch-free, so a loop over `i` inlining it
/// vectorizes.
#[inline(always)]
pub fn normal_mixed(mixed: u64, i: u64) -> f32 {
    let unit = |c: u64| (splitmix64(mixed.wrapping_add(c)) >> 11) as f64 * F64_UNIT;
    let (u1, u2) = (unit(i.wrapping_mul(2)), unit(i.wrapping_mul(2).wrapping_add(1)));
    let lane = &mut math64::Lane;
    let r = (-2.0 * math64::ln(lane, &(1.0 - u1))).sqrt();
    (r * math64::cos_within_turn(lane, &(std::f64::consts::TAU * u2))) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_reference_values() {
        // First outputs of the reference SplitMix64 generator seeded with 0 (state advanced by
        // the golden gamma each step, which is what `splitmix64(k * gamma)` computes).
        let gamma = 0x9E37_79B9_7F4A_7C15u64;
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(gamma), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(gamma.wrapping_mul(2)), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn same_seed_same_values_different_seed_different_values() {
        let a: Vec<f32> = (0..100).map(|i| normal(7, i)).collect();
        let b: Vec<f32> = (0..100).map(|i| normal(7, i)).collect();
        let c: Vec<f32> = (0..100).map(|i| normal(8, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let u: Vec<f32> = (0..100).map(|i| uniform(7, i)).collect();
        assert_eq!(u, (0..100).map(|i| uniform(7, i)).collect::<Vec<_>>());
        assert_ne!(u, (0..100).map(|i| uniform(8, i)).collect::<Vec<_>>());
    }

    #[test]
    fn uniform_is_in_unit_interval_with_mean_one_half() {
        let n = 100_000;
        let xs: Vec<f32> = (0..n).map(|i| uniform(42, i)).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
        let var = xs.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.005, "variance {var}");
    }

    #[test]
    fn uniform_extremes_stay_below_one() {
        // The largest 24-bit value maps to 1 - 2^-24, not 1.
        assert!(((u64::MAX >> 40) as f32 * F32_UNIT) < 1.0);
    }

    #[test]
    fn normal_has_mean_zero_and_unit_std() {
        let n = 100_000;
        let xs: Vec<f64> = (0..n).map(|i| f64::from(normal(1234, i))).collect();
        assert!(xs.iter().all(|x| x.is_finite()));
        let mean = xs.iter().sum::<f64>() / n as f64;
        let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((std - 1.0).abs() < 0.02, "std {std}");
        // About 68.3% within one standard deviation.
        let within = xs.iter().filter(|x| x.abs() < 1.0).count() as f64 / n as f64;
        assert!((within - 0.6827).abs() < 0.01, "within one sigma {within}");
    }

    #[test]
    fn normal_is_libms_box_muller_but_for_rare_double_roundings_one_ulp_apart() {
        let (mut differ, n) = (0, 400_000u64);
        for i in 0..n {
            let unit = |c: u64| (bits(3, c) >> 11) as f64 * F64_UNIT;
            let (u1, u2) = (unit(2 * i), unit(2 * i + 1));
            let libm = ((-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32;
            let got = normal(3, i);
            if got != libm {
                differ += 1;
                assert_eq!(got.to_bits().abs_diff(libm.to_bits()), 1, "element {i}: {got:e} against libm's {libm:e}");
            }
        }
        assert!(differ <= 4, "{differ} of {n} elements differ from libm's");
    }

    #[test]
    fn normal_counters_pair_up() {
        // Element i consumes counters 2i and 2i+1, so it is a function of those bits alone.
        let seed = 99;
        let i = 5;
        let u1 = (bits(seed, 2 * i) >> 11) as f64 * F64_UNIT;
        let u2 = (bits(seed, 2 * i + 1) >> 11) as f64 * F64_UNIT;
        let cos = math64::one::cos_within_turn(std::f64::consts::TAU * u2);
        let expected = ((-2.0 * math64::one::ln(1.0 - u1)).sqrt() * cos) as f32;
        assert_eq!(normal(seed, i), expected);
        // libm's functions round to the same f32 but in rare cases of double rounding.
        let libm = ((-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32;
        assert_eq!(normal(seed, i), libm);
    }
}
