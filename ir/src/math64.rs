//! `f64`'s transcendental functions (`ln`, `exp`, `tanh`, `sigmoid`, `pow`, `erf`, and `cos`
//! over one turn for `randn`), written
//! once over [`F64Ops`], a handful of IEEE operations: the semantics of `f64` tensors on
//! every backend. The interpreter computes them one element at a time ([`Lane`], through
//! [`exp`] and friends) or over slices the compiler vectorizes (`gt-runtime`'s `vmath`),
//! the JIT's kernels call or tile the same code, and the PTX generator emits them as
//! instructions, so an `f64` op gives the same bits eager, fused and on a GPU. `ln`, `exp`,
//! `tanh` and `sigmoid` are within 2 ulp of libm, `erf` within 1 of the `libm` crate's;
//! `pow` is `exp(b ln |a|)`, whose relative error grows with `|b ln a|` (about 1e-13 at
//! 1e300). Every function is branch-free (each case computed, one selected): a GPU warp
//! never diverges and a CPU loop over them vectorizes.

/// ln 2 in two parts (fdlibm): `e * LN2_HI` is exact for the exponents of f64.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
/// See [`LN2_HI`].
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);

/// The `f64` operations the functions are written in, each rounded to nearest (ties to
/// even) as IEEE says.
pub trait F64Ops {
    /// A value.
    type V: Clone;
    /// A truth value.
    type P: Clone;
    /// The constant `x`.
    fn c(&mut self, x: f64) -> Self::V;
    /// `a + b`.
    fn add(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
    /// `a - b`.
    fn sub(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
    /// `a * b`.
    fn mul(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
    /// `a / b`.
    fn div(&mut self, a: &Self::V, b: &Self::V) -> Self::V;
    /// `a * b + c`, rounded once.
    fn fma(&mut self, a: &Self::V, b: &Self::V, c: &Self::V) -> Self::V;
    /// The nearest integer (ties to even).
    fn rint(&mut self, a: &Self::V) -> Self::V;
    /// The integer toward zero.
    fn trunc(&mut self, a: &Self::V) -> Self::V;
    /// `|a|`.
    fn abs(&mut self, a: &Self::V) -> Self::V;
    /// `-a`.
    fn neg(&mut self, a: &Self::V) -> Self::V;
    /// `|magnitude|` with the sign of `sign`.
    fn copysign(&mut self, magnitude: &Self::V, sign: &Self::V) -> Self::V;
    /// `a` with the low 32 bits of its representation cleared (fdlibm's `SET_LOW_WORD(a, 0)`).
    fn clear_low_word(&mut self, a: &Self::V) -> Self::V;
    /// `(m, e)` with `a = m 2^e`, `m` in `[1, 2)`, for a positive normal `a`.
    fn frexp(&mut self, a: &Self::V) -> (Self::V, Self::V);
    /// `a 2^k` for an integral `k` in `[-1076, 1076]`, rounded once (two exact scalings by
    /// normal powers of two, so that subnormal and infinite results come out right).
    fn ldexp(&mut self, a: &Self::V, k: &Self::V) -> Self::V;
    /// `a < b` (false with a NaN).
    fn lt(&mut self, a: &Self::V, b: &Self::V) -> Self::P;
    /// `a > b` (false with a NaN).
    fn gt(&mut self, a: &Self::V, b: &Self::V) -> Self::P;
    /// `a == b` (false with a NaN).
    fn eq(&mut self, a: &Self::V, b: &Self::V) -> Self::P;
    /// Not equal, NaN included.
    fn ne(&mut self, a: &Self::V, b: &Self::V) -> Self::P;
    /// Whether `a` is NaN.
    fn is_nan(&mut self, a: &Self::V) -> Self::P;
    /// `p` or `q`.
    fn or(&mut self, p: &Self::P, q: &Self::P) -> Self::P;
    /// `p` and `q`.
    fn and(&mut self, p: &Self::P, q: &Self::P) -> Self::P;
    /// `on_true` where `p`, else `on_false`.
    fn select(&mut self, p: &Self::P, on_true: &Self::V, on_false: &Self::V) -> Self::V;
}

/// `atanh(s) / s = sum s^2k / (2k + 1)`, `k` to 11: [`ln`]'s series.
const ATANH: [f64; 12] = {
    let mut c = [0.0; 12];
    let mut k = 0;
    while k < c.len() {
        c[k] = 1.0 / (2 * k + 1) as f64;
        k += 1;
    }
    c
};

/// `1 / j!`, `j` to 13: [`exp`]'s Taylor series (the factorials are exact).
const EXP: [f64; 14] = {
    let mut c = [0.0; 14];
    let (mut j, mut factorial) = (0, 1.0);
    while j < c.len() {
        if j > 0 {
            factorial *= j as f64;
        }
        c[j] = 1.0 / factorial;
        j += 1;
    }
    c
};

/// `ln x`: `x = 2^e m` with `m` in `[sqrt(1/2), sqrt(2))`, `ln m = 2 atanh(s)`,
/// `s = (m - 1) / (m + 1)`, `|s| < 0.172`, by its series to s^23; subnormals scaled by 2^54
/// first; `ln 0 = -inf`, negative `x` NaN.
#[inline(always)]
pub fn ln<W: F64Ops>(w: &mut W, x: &W::V) -> W::V {
    let tiny = {
        let least = w.c(f64::MIN_POSITIVE);
        w.lt(x, &least)
    };
    let scaled = {
        let two54 = w.c(2f64.powi(54));
        w.mul(x, &two54)
    };
    let xs = w.select(&tiny, &scaled, x);
    let (m, e) = w.frexp(&xs);
    let e_small = {
        let k = w.c(54.0);
        w.sub(&e, &k)
    };
    let e = w.select(&tiny, &e_small, &e);
    let big = {
        let root = w.c(std::f64::consts::SQRT_2);
        w.gt(&m, &root)
    };
    let half = {
        let h = w.c(0.5);
        w.mul(&m, &h)
    };
    let m = w.select(&big, &half, &m);
    let one = w.c(1.0);
    let e1 = w.add(&e, &one);
    let e = w.select(&big, &e1, &e);
    let num = w.sub(&m, &one);
    let den = w.add(&m, &one);
    let s = w.div(&num, &den);
    let s2 = w.mul(&s, &s);
    let p = poly(w, &ATANH, &s2);
    let two_s = w.add(&s, &s);
    let ln_m = w.mul(&two_s, &p);
    // ln 2 in two parts: e * LN2_HI is exact for |e| < 2^11.
    let (hi, lo) = (w.c(LN2_HI), w.c(LN2_LO));
    let low = w.fma(&e, &lo, &ln_m);
    let r = w.fma(&e, &hi, &low);
    // Zero, negatives, infinity and NaN.
    let zero = w.c(0.0);
    let (is_zero, negative) = (w.eq(x, &zero), w.lt(x, &zero));
    let inf = w.c(f64::INFINITY);
    let is_inf = w.eq(x, &inf);
    let minus_inf = w.c(f64::NEG_INFINITY);
    let nan = w.c(f64::NAN);
    let r = w.select(&is_zero, &minus_inf, &r);
    let r = w.select(&negative, &nan, &r);
    let r = w.select(&is_inf, &inf, &r);
    let x_nan = w.is_nan(x);
    w.select(&x_nan, x, &r)
}

/// `e^x`: `x = k ln 2 + r`, `|r| <= ln 2 / 2` (ln 2 in two parts), `e^r` by its Taylor
/// series to r^13, scaled by 2^k; `x` clamped to `[-746, 710]` first, where the result is
/// already 0 or infinite.
#[inline(always)]
pub fn exp<W: F64Ops>(w: &mut W, x: &W::V) -> W::V {
    let (lo_bound, hi_bound) = (w.c(-746.0), w.c(710.0));
    let over = w.gt(x, &hi_bound);
    let xc = w.select(&over, &hi_bound, x);
    let under = w.lt(&xc, &lo_bound);
    let xc = w.select(&under, &lo_bound, &xc);
    let k = {
        let log2e = w.c(std::f64::consts::LOG2_E);
        let t = w.mul(&xc, &log2e);
        w.rint(&t)
    };
    let (hi, lo) = (w.c(-LN2_HI), w.c(-LN2_LO));
    let r = w.fma(&k, &hi, &xc);
    let r = w.fma(&k, &lo, &r);
    let p = poly(w, &EXP, &r);
    let y = w.ldexp(&p, &k);
    let x_nan = w.is_nan(x);
    w.select(&x_nan, x, &y)
}

/// Below this `|x|`, [`tanh`] is its Taylor series.
const SERIES_BOUND: f64 = 0.55;
/// `tanh x = x + sum TANH[k] x^(2k+1)`: the coefficients `(-1)^k T(k+1) / (2k+1)!` from the
/// tangent numbers `T` (1, 2, 16, 272, ...), computed exactly and rounded once. Below
/// [`SERIES_BOUND`], the terms left out are under 1e-17 of `x`.
const TANH: [f64; 19] = [
    -0.3333333333333333,
    0.13333333333333333,
    -0.05396825396825397,
    0.021869488536155203,
    -0.008863235529902197,
    0.003592128036572481,
    -0.0014558343870513183,
    0.000590027440945586,
    -0.00023912911424355248,
    9.691537956929451e-05,
    -3.927832388331683e-05,
    1.5918905069328964e-05,
    -6.451689215655431e-06,
    2.6147711512907546e-06,
    -1.0597268320104654e-06,
    4.294911078273806e-07,
    -1.7406618963571648e-07,
    7.054636946400968e-08,
    -2.859136662305254e-08,
];

/// `tanh x` with the sign of `x`: for small `|x|` its series `x + x s q(s)`, `s = x^2` (the
/// correction is under a tenth of `x`, so its rounding barely shows); else `-t / (2 + t)`
/// with `t = e^(-2|x|) - 1`, which never overflows.
#[inline(always)]
pub fn tanh<W: F64Ops>(w: &mut W, x: &W::V) -> W::V {
    let s = w.mul(x, x);
    let q = poly(w, &TANH, &s);
    let xs = w.mul(x, &s);
    let r_small = w.fma(&xs, &q, x);
    let a = w.abs(x);
    let two = w.c(2.0);
    let minus_two = w.c(-2.0);
    let y = w.mul(&a, &minus_two);
    let e = exp(w, &y);
    let one = w.c(1.0);
    let t = w.sub(&e, &one);
    let den = w.add(&t, &two);
    let num = w.neg(&t);
    let r_big = w.div(&num, &den);
    let r_big = w.copysign(&r_big, x);
    let small = {
        let bound = w.c(SERIES_BOUND);
        w.lt(&a, &bound)
    };
    w.select(&small, &r_small, &r_big)
}

/// `sigmoid x`: `e / (1 + e)` below 0, `1 / (1 + e)` above, `e = e^-|x|` (the interpreter's
/// two formulas, one `exp`).
#[inline(always)]
pub fn sigmoid<W: F64Ops>(w: &mut W, x: &W::V) -> W::V {
    let a = w.abs(x);
    let na = w.neg(&a);
    let e = exp(w, &na);
    let one = w.c(1.0);
    let den = w.add(&one, &e);
    let neg_side = w.div(&e, &den);
    let pos_side = w.div(&one, &den);
    let zero = w.c(0.0);
    let negative = w.lt(x, &zero);
    w.select(&negative, &neg_side, &pos_side)
}

/// `a^b` as C's `pow`: `e^(b ln |a|)`, negated for a negative base with an odd integer
/// exponent, NaN for a negative base with a fractional one; `a^0 = 1^b = (-1)^(+-inf) = 1`.
#[inline(always)]
pub fn pow<W: F64Ops>(w: &mut W, a: &W::V, b: &W::V) -> W::V {
    let abs = w.abs(a);
    let l = ln(w, &abs);
    let t = w.mul(b, &l);
    let mag = exp(w, &t);
    let bi = w.trunc(b);
    let is_int = w.eq(&bi, b);
    let half = {
        let h = w.c(0.5);
        w.mul(b, &h)
    };
    let half_i = w.trunc(&half);
    let odd = w.ne(&half_i, &half);
    let neg_mag = w.neg(&mag);
    let signed = w.select(&odd, &neg_mag, &mag);
    let nan = w.c(f64::NAN);
    // -inf to a fractional power is +inf or 0 (e^(b ln inf)), not NaN.
    let inf = w.c(f64::INFINITY);
    let infinite_base = w.eq(&abs, &inf);
    let fractional = w.select(&infinite_base, &mag, &nan);
    let negative_base = w.select(&is_int, &signed, &fractional);
    let zero = w.c(0.0);
    let is_neg = w.lt(a, &zero);
    let r = w.select(&is_neg, &negative_base, &mag);
    let one = w.c(1.0);
    let zero_exp = w.eq(b, &zero);
    let unit_base = w.eq(a, &one);
    let b_abs = w.abs(b);
    let inf_exp = w.eq(&b_abs, &inf);
    let unit_abs = w.eq(&abs, &one);
    let minus_one_inf = w.and(&inf_exp, &unit_abs);
    let trivial = w.or(&zero_exp, &unit_base);
    let trivial = w.or(&trivial, &minus_one_inf);
    let r = w.select(&trivial, &one, &r);
    // `a^1`, `a^2` and `a^-1` exactly, as libm gives them (the logarithm costs digits).
    let (two, minus_one) = (w.c(2.0), w.c(-1.0));
    let (square, inverse) = (w.mul(a, a), w.div(&one, a));
    let (first, second, minus_first) = (w.eq(b, &one), w.eq(b, &two), w.eq(b, &minus_one));
    let r = w.select(&first, a, &r);
    let r = w.select(&second, &square, &r);
    w.select(&minus_first, &inverse, &r)
}

/// `erf(1)` rounded to 24 bits (fdlibm's `erx`): `1 - ERX` is exact.
const ERX: f64 = 0.8450629115104675;
/// `8 (2 / sqrt(pi) - 1)`: `erf x = (8x + ERF_EFX8 x) / 8` below 2^-28.
const ERF_EFX8: f64 = 1.0270333367641007;
/// Where [`ERF_RA`] gives way to [`ERF_RB`]: about `1 / 0.35`, fdlibm's high word `0x4006DB6D`.
const ERF_RB_FROM: f64 = f64::from_bits(0x4006_DB6D_0000_0000);
/// `erf x = x + x P(x^2) / Q(x^2)` below 0.84375: `P`.
const ERF_P: [f64; 5] =
    [0.12837916709551256, -0.3250421072470015, -0.02848174957559851, -0.005770270296489442, -2.3763016656650163e-05];
/// See [`ERF_P`]: `Q`.
const ERF_Q: [f64; 6] = [
    1.0,
    0.39791722395915535,
    0.0650222499887673,
    0.005081306281875766,
    0.00013249473800432164,
    -3.960228278775368e-06,
];
/// `erf(1 + s) = ERX + P(s) / Q(s)` in `[0.84375, 1.25)`: `P`.
const ERF_PA: [f64; 7] = [
    -0.0023621185607526594,
    0.41485611868374833,
    -0.3722078760357013,
    0.31834661990116175,
    -0.11089469428239668,
    0.035478304325618236,
    -0.002166375594868791,
];
/// See [`ERF_PA`]: `Q`.
const ERF_QA: [f64; 7] = [
    1.0,
    0.10642088040084423,
    0.540397917702171,
    0.07182865441419627,
    0.12617121980876164,
    0.01363708391202905,
    0.011984499846799107,
];
/// `erfc x = e^(-x^2 - 0.5625 + R(s) / S(s)) / x`, `s = 1 / x^2`, in `[1.25, 1 / 0.35)`: `R`.
const ERF_RA: [f64; 8] = [
    -0.009864944034847148,
    -0.6938585727071818,
    -10.558626225323291,
    -62.375332450326006,
    -162.39666946257347,
    -184.60509290671104,
    -81.2874355063066,
    -9.814329344169145,
];
/// See [`ERF_RA`]: `S`.
const ERF_SA: [f64; 9] = [
    1.0,
    19.651271667439257,
    137.65775414351904,
    434.56587747522923,
    645.3872717332679,
    429.00814002756783,
    108.63500554177944,
    6.570249770319282,
    -0.0604244152148581,
];
/// As [`ERF_RA`] in `[1 / 0.35, 6)`: `R`.
const ERF_RB: [f64; 7] = [
    -0.0098649429247001,
    -0.799283237680523,
    -17.757954917754752,
    -160.63638485582192,
    -637.5664433683896,
    -1025.0951316110772,
    -483.5191916086514,
];
/// See [`ERF_RB`]: `S`.
const ERF_SB: [f64; 8] = [
    1.0,
    30.33806074348246,
    325.7925129965739,
    1536.729586084437,
    3199.8582195085955,
    2553.0504064331644,
    474.52854120695537,
    -22.44095244658582,
];

/// `c[0] + v c[1] + ... + v^n c[n]` by Horner's rule, one fused multiply-add a step.
#[inline(always)]
fn poly<W: F64Ops>(w: &mut W, c: &[f64], v: &W::V) -> W::V {
    let mut p = w.c(c[c.len() - 1]);
    for &k in c[..c.len() - 1].iter().rev() {
        let term = w.c(k);
        p = w.fma(&p, v, &term);
    }
    p
}

/// `pi/2 - FRAC_PI_2`: the low part of pi/2 for [`cos_within_turn`]'s reduction (Cody-Waite).
const PI_2_LO: f64 = 6.123_233_995_736_766e-17;

/// `(-1)^j / (2j + odd)!`, `j` to 8: the Taylor series of `cos r` (`odd` 0) and of
/// `sin r / r` (`odd` 1) in `r^2`.
const fn trig_series(odd: usize) -> [f64; 9] {
    let mut c = [0.0; 9];
    let mut j = 0;
    while j < c.len() {
        let mut factorial = 1.0;
        let mut k = 2;
        while k <= 2 * j + odd {
            factorial *= k as f64;
            k += 1;
        }
        c[j] = if j % 2 == 0 { 1.0 } else { -1.0 } / factorial;
        j += 1;
    }
    c
}

/// [`trig_series`] of `cos`.
const COS: [f64; 9] = trig_series(0);
/// [`trig_series`] of `sin r / r`.
const SIN: [f64; 9] = trig_series(1);

/// `cos x` for `0 <= x <= 2 pi` only, the angle `randn`'s Box-Muller step takes
/// (`gt_ir::random`): `x = k pi/2 + r`, `k` in 0..=4, `|r| <= pi/4` (pi/2 in two parts, so
/// `k` times the high one is exact), then the series of `cos r` or `sin r` (to r^16 / r^17,
/// terms left out under 1e-17) with the quadrant's sign. Within 2 ulp of libm, or 1e-17
/// absolute where the result is near a zero of `cos`.
#[inline(always)]
pub fn cos_within_turn<W: F64Ops>(w: &mut W, x: &W::V) -> W::V {
    let k = {
        let two_over_pi = w.c(std::f64::consts::FRAC_2_PI);
        let q = w.mul(x, &two_over_pi);
        w.rint(&q)
    };
    let (hi, lo) = (w.c(-std::f64::consts::FRAC_PI_2), w.c(-PI_2_LO));
    let r = w.fma(&k, &hi, x);
    let r = w.fma(&k, &lo, &r);
    let r2 = w.mul(&r, &r);
    let cos_r = poly(w, &COS, &r2);
    let sin_r = {
        let p = poly(w, &SIN, &r2);
        w.mul(&p, &r)
    };
    // k = 0 or 4: cos r; 1: -sin r; 2: -cos r; 3: sin r.
    let is = |w: &mut W, q: f64| {
        let q = w.c(q);
        w.eq(&k, &q)
    };
    let (k1, k2, k3) = (is(w, 1.0), is(w, 2.0), is(w, 3.0));
    let use_sin = w.or(&k1, &k3);
    let base = w.select(&use_sin, &sin_r, &cos_r);
    let flip = w.or(&k1, &k2);
    let negated = w.neg(&base);
    w.select(&flip, &negated, &base)
}

/// `erf x` as fdlibm computes it (FreeBSD's `s_erf.c` by way of musl and the `libm` crate,
/// which the interpreter calls): a rational function in `x^2` below 0.84375, in `|x| - 1`
/// below 1.25, and `1 - erfc x` below 6 with `erfc` from the asymptotic series' rational
/// fit (two `exp`s: `x^2` split as `z^2 + (z - x)(z + x)`, `z` the top 21 bits of `x`, so
/// that no digits are lost to it); 1 above. Every interval is computed and one selected (no
/// branches, so a warp never diverges).
#[inline(always)]
pub fn erf<W: F64Ops>(w: &mut W, x: &W::V) -> W::V {
    let a = w.abs(x);
    let one = w.c(1.0);
    let x2 = w.mul(x, x);
    let (p, q) = (poly(w, &ERF_P, &x2), poly(w, &ERF_Q, &x2));
    let y = w.div(&p, &q);
    let small = w.fma(x, &y, x);
    let tiny = {
        let (efx8, eight, eighth) = (w.c(ERF_EFX8), w.c(8.0), w.c(0.125));
        let e = w.mul(&efx8, x);
        let t = w.fma(&eight, x, &e);
        w.mul(&t, &eighth)
    };
    // [0.84375, 1.25): 1 - erfc, erfc = (1 - ERX) - P/Q, as musl writes it.
    let s = w.sub(&a, &one);
    let (p, q) = (poly(w, &ERF_PA, &s), poly(w, &ERF_QA, &s));
    let pq = w.div(&p, &q);
    let one_minus_erx = w.c(1.0 - ERX);
    let erfc = w.sub(&one_minus_erx, &pq);
    let near_one = w.sub(&one, &erfc);
    // [1.25, 6).
    let a2 = w.mul(&a, &a);
    let s = w.div(&one, &a2);
    let before = {
        let bound = w.c(ERF_RB_FROM);
        w.lt(&a, &bound)
    };
    let (ra, sa, rb, sb) = (poly(w, &ERF_RA, &s), poly(w, &ERF_SA, &s), poly(w, &ERF_RB, &s), poly(w, &ERF_SB, &s));
    let r = w.select(&before, &ra, &rb);
    let big_s = w.select(&before, &sa, &sb);
    let z = w.clear_low_word(&a);
    let nz = w.neg(&z);
    let shift = w.c(-0.5625);
    // z^2 is exact (21 bits squared).
    let t1 = w.fma(&nz, &z, &shift);
    let (zm, zp) = (w.sub(&z, &a), w.add(&z, &a));
    let d = w.mul(&zm, &zp);
    let rs = w.div(&r, &big_s);
    let t2 = w.add(&d, &rs);
    let (e1, e2) = (exp(w, &t1), exp(w, &t2));
    let e = w.mul(&e1, &e2);
    let erfc = w.div(&e, &a);
    let tail = w.sub(&one, &erfc);
    let below = |w: &mut W, bound: f64| {
        let b = w.c(bound);
        w.lt(&a, &b)
    };
    let (under6, under125, under084, under_tiny) =
        (below(w, 6.0), below(w, 1.25), below(w, 0.84375), below(w, 2f64.powi(-28)));
    let r = w.select(&under6, &tail, &one);
    let r = w.select(&under125, &near_one, &r);
    let r = w.copysign(&r, x);
    let r = w.select(&under084, &small, &r);
    let r = w.select(&under_tiny, &tiny, &r);
    let x_nan = w.is_nan(x);
    w.select(&x_nan, x, &r)
}

/// The operations on one `f64` on the CPU. Inlined into a loop built for wider vectors, the
/// loop vectorizes; `fma` is one rounding everywhere (the instruction where the CPU has it,
/// else libm's exact `fma`), so the bits do not depend on the CPU.
#[derive(Debug, Clone, Copy)]
pub struct Lane;

impl F64Ops for Lane {
    type V = f64;
    type P = bool;

    #[inline(always)]
    fn c(&mut self, x: f64) -> f64 {
        x
    }
    #[inline(always)]
    fn add(&mut self, a: &f64, b: &f64) -> f64 {
        a + b
    }
    #[inline(always)]
    fn sub(&mut self, a: &f64, b: &f64) -> f64 {
        a - b
    }
    #[inline(always)]
    fn mul(&mut self, a: &f64, b: &f64) -> f64 {
        a * b
    }
    #[inline(always)]
    fn div(&mut self, a: &f64, b: &f64) -> f64 {
        a / b
    }
    #[inline(always)]
    fn fma(&mut self, a: &f64, b: &f64, c: &f64) -> f64 {
        a.mul_add(*b, *c)
    }
    #[inline(always)]
    fn rint(&mut self, a: &f64) -> f64 {
        a.round_ties_even()
    }
    #[inline(always)]
    fn trunc(&mut self, a: &f64) -> f64 {
        a.trunc()
    }
    #[inline(always)]
    fn abs(&mut self, a: &f64) -> f64 {
        a.abs()
    }
    #[inline(always)]
    fn neg(&mut self, a: &f64) -> f64 {
        -a
    }
    #[inline(always)]
    fn copysign(&mut self, magnitude: &f64, sign: &f64) -> f64 {
        magnitude.copysign(*sign)
    }
    #[inline(always)]
    fn clear_low_word(&mut self, a: &f64) -> f64 {
        f64::from_bits(a.to_bits() & 0xFFFF_FFFF_0000_0000)
    }
    #[inline(always)]
    fn frexp(&mut self, a: &f64) -> (f64, f64) {
        let bits = a.to_bits();
        // Through `i32`, which vectors convert to `f64` directly (the value is exact either way).
        let e = ((bits >> 52) & 2047) as i32 - 1023;
        (f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000), f64::from(e))
    }
    #[inline(always)]
    fn ldexp(&mut self, a: &f64, k: &f64) -> f64 {
        // `k` split in two halves, each a normal power of two (as the PTX). The powers are
        // built in the float unit, not by converting `k` to an integer (which vector units
        // do one lane at a time where they convert at all): `j + 1023 + 2^52` holds the
        // biased exponent `j + 1023` in its low bits. A NaN `k` (only where the result is
        // replaced after) gives some power.
        let k1 = (k * 0.5).floor();
        let k2 = k - k1;
        let power = |j: f64| f64::from_bits((j + (1023.0 + 4_503_599_627_370_496.0)).to_bits() << 52);
        a * power(k1) * power(k2)
    }
    #[inline(always)]
    fn lt(&mut self, a: &f64, b: &f64) -> bool {
        a < b
    }
    #[inline(always)]
    fn gt(&mut self, a: &f64, b: &f64) -> bool {
        a > b
    }
    #[inline(always)]
    fn eq(&mut self, a: &f64, b: &f64) -> bool {
        a == b
    }
    #[inline(always)]
    fn ne(&mut self, a: &f64, b: &f64) -> bool {
        a != b
    }
    #[inline(always)]
    fn is_nan(&mut self, a: &f64) -> bool {
        a.is_nan()
    }
    #[inline(always)]
    fn or(&mut self, p: &bool, q: &bool) -> bool {
        *p | *q
    }
    #[inline(always)]
    fn and(&mut self, p: &bool, q: &bool) -> bool {
        *p & *q
    }
    #[inline(always)]
    fn select(&mut self, p: &bool, on_true: &f64, on_false: &f64) -> f64 {
        if *p {
            *on_true
        } else {
            *on_false
        }
    }
}

/// Defines a scalar entry point for each function: [`Lane`]'s code, built with fused
/// multiply-adds where the CPU has them (checked once), as a plain function.
macro_rules! on_one {
    ($($(#[$doc:meta])* $name:ident($($arg:ident),*);)*) => {$(
        $(#[$doc])*
        #[inline]
        pub fn $name($($arg: f64),*) -> f64 {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "fma")]
                fn with_fma($($arg: f64),*) -> f64 {
                    fns::$name(&mut Lane, $(&$arg),*)
                }
                if std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has the feature the function is built for.
                    #[allow(unsafe_code)]
                    return unsafe { with_fma($($arg),*) };
                }
            }
            fns::$name(&mut Lane, $(&$arg),*)
        }
    )*};
}

/// The functions over any [`F64Ops`], under the names the scalar entry points take.
mod fns {
    pub(super) use super::{cos_within_turn, erf, exp, ln, pow, sigmoid, tanh};
}

/// The scalar entry points.
pub mod one {
    use super::{fns, Lane};

    on_one! {
        /// `ln x` ([`super::ln`]).
        ln(x);
        /// `e^x` ([`super::exp`]).
        exp(x);
        /// `tanh x` ([`super::tanh`]).
        tanh(x);
        /// The logistic function ([`super::sigmoid`]).
        sigmoid(x);
        /// `erf x` ([`super::erf`]).
        erf(x);
        /// `a^b` ([`super::pow`]).
        pow(a, b);
        /// `cos x` for `0 <= x <= 2 pi` ([`super::cos_within_turn`]).
        cos_within_turn(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between two finite f64s of one sign (0 when equal).
    fn ulps(a: f64, b: f64) -> u64 {
        if a == b || (a.is_nan() && b.is_nan()) {
            return 0;
        }
        if a.is_sign_negative() != b.is_sign_negative() || !a.is_finite() || !b.is_finite() {
            return u64::MAX;
        }
        a.to_bits().abs_diff(b.to_bits())
    }

    /// Inputs spread over `[lo, hi]` (splitmix64), and `extra`.
    fn inputs(lo: f64, hi: f64, n: usize, extra: &[f64]) -> Vec<f64> {
        let mut out: Vec<f64> = (0..n as u64)
            .map(|i| {
                let u = (crate::random::splitmix64(i) >> 11) as f64 / (1u64 << 53) as f64;
                lo + (hi - lo) * u
            })
            .collect();
        out.extend_from_slice(extra);
        out
    }

    fn within(name: &str, f: impl Fn(f64) -> f64, reference: impl Fn(f64) -> f64, xs: &[f64], max: u64) {
        let mut worst = (0, 0.0);
        for &x in xs {
            let (got, want) = (f(x), reference(x));
            let d = ulps(got, want);
            assert!(d <= max, "{name}({x:e}) = {got:e}, libm {want:e}: {d} ulp");
            if d > worst.0 {
                worst = (d, x);
            }
        }
        eprintln!("{name}: worst {} ulp at {:e}", worst.0, worst.1);
    }

    const SPECIAL: [f64; 10] = [0.0, -0.0, 1.0, -1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-300, -1e-300, 0.5];

    #[test]
    fn ln_within_two_ulp_of_libm() {
        let mut xs = inputs(0.0, 10.0, 20_000, &SPECIAL);
        xs.extend(inputs(-1074.0, 1023.0, 20_000, &[]).into_iter().map(f64::exp2));
        xs.extend([5e-324, 2.2e-308, f64::MAX, f64::MIN_POSITIVE, -3.0]);
        within("ln", one::ln, f64::ln, &xs, 2);
    }

    #[test]
    fn exp_within_two_ulp_of_libm() {
        let xs = inputs(-750.0, 715.0, 40_000, &[709.782712893384, -745.1332191019411, -708.5, 1e-17, -1e-17]);
        let xs: Vec<f64> = xs.into_iter().chain(SPECIAL).chain(inputs(-2.0, 2.0, 10_000, &[])).collect();
        within("exp", one::exp, f64::exp, &xs, 2);
    }

    #[test]
    fn tanh_and_sigmoid_within_two_ulp_of_libm() {
        let mut xs = inputs(-25.0, 25.0, 20_000, &SPECIAL);
        xs.extend(inputs(-0.5, 0.5, 20_000, &[1e-9, -1e-200, 0.17328, 0.1733, 19.1, -800.0]));
        within("tanh", one::tanh, f64::tanh, &xs, 2);
        within("sigmoid", one::sigmoid, crate::ops::sigmoid::<f64>, &xs, 2);
    }

    #[test]
    fn cos_over_a_turn_within_two_ulp_of_libm_or_1e17_near_its_zeros() {
        let quarter = std::f64::consts::FRAC_PI_2;
        let mut xs = inputs(0.0, std::f64::consts::TAU, 40_000, &[0.0, std::f64::consts::TAU, std::f64::consts::PI]);
        // Each quadrant's edges, where `k` changes and `|r|` is largest.
        for k in 0..=4 {
            let edge = f64::from(k) * quarter;
            let turn = 0.0..=std::f64::consts::TAU;
            xs.extend(inputs(edge - 1e-3, edge + 1e-3, 2_000, &[edge]).into_iter().filter(|x| turn.contains(x)));
            if k < 4 {
                let mid = edge + quarter / 2.0;
                xs.extend(inputs(mid - 1e-9, mid + 1e-9, 200, &[]));
            }
        }
        let mut worst = 0;
        for &x in &xs {
            let (got, want) = (one::cos_within_turn(x), x.cos());
            let d = ulps(got, want);
            assert!(d <= 2 || (got - want).abs() <= 1e-17, "cos({x:e}) = {got:e}, libm {want:e}: {d} ulp");
            worst = worst.max(if want.abs() > 1e-3 { d } else { 0 });
        }
        eprintln!("cos: worst {worst} ulp away from its zeros");
    }

    #[test]
    fn erf_within_one_ulp_of_the_interpreters() {
        // Every interval and its edges, both signs.
        let mut xs = inputs(-7.0, 7.0, 40_000, &SPECIAL);
        xs.extend(inputs(-1.3, 1.3, 20_000, &[]));
        for edge in [2f64.powi(-28), 0.84375, 1.25, ERF_RB_FROM, 6.0, 5e-324, 1e-310, 27.0] {
            for x in [edge, edge.next_down(), edge.next_up()] {
                xs.extend([x, -x]);
            }
        }
        within("erf", one::erf, libm::erf, &xs, 1);
    }

    #[test]
    fn pow_is_close_to_libm_and_exact_at_its_special_cases() {
        let (a, b) = (inputs(-10.0, 10.0, 4000, &[]), inputs(-20.0, 20.0, 4000, &[]));
        for (&x, &y) in a.iter().zip(&b) {
            // A fractional power of a negative base is NaN on both sides.
            let (got, want) = (one::pow(x, y), x.powf(y));
            let close = (got.is_nan() && want.is_nan()) || (got - want).abs() <= 1e-13 * want.abs();
            assert!(close, "pow({x}, {y}) = {got:e}, libm {want:e}");
        }
        for &x in &SPECIAL {
            for &y in SPECIAL.iter().chain(&[2.0, 3.0, -3.0, 0.5]) {
                let (got, want) = (one::pow(x, y), x.powf(y));
                // -0 to an odd negative power is -inf in C; this gives +inf (as the f32 kernels).
                let signed_zero = x == 0.0 && x.is_sign_negative() && y == -3.0;
                if !signed_zero {
                    assert!(
                        ulps(got, want) == 0 || (got - want).abs() <= 1e-13 * want.abs(),
                        "pow({x}, {y}) = {got}, libm {want}"
                    );
                }
            }
        }
    }
}
