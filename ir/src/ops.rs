//! The op table: one row per elementwise and reduction op, and everything else reads it.
//! A row gives the op's mnemonic (the parser, printer, kernel text, e-graph and `gt!` use
//! it), its doc, its scalar semantics (`apply`: the interpreter's, which constant folding
//! and every backend follow), its cost weight (e-graph extraction; `is_costly` for the JIT's
//! recompute decisions), its dtype domain, and its gradient as a formula over other ops
//! (`formula.rs`; autograd has no per-op arm). A *composite* op is a formula over
//! primitive ops (its expansion): the interpreter evaluates it, the fuse pass and the code
//! generators expand it, so it needs no code-generator arm.
//!
//! Adding an elementwise op (see `docs/add-an-op.md`):
//! - primitive: its row here (with `apply`'s arm on the `...Prim` enum), its CLIF
//!   (`runtime/src/backend/cpu/jit/math.rs`), its PTX (`runtime/src/backend/cuda/ptx/math.rs`)
//!   and one filetest; every other place derives from the row, and the code generators'
//!   matches on the primitive enums are exhaustive, so the compiler lists what is missing;
//! - composite: its row here and one filetest.

use crate::formula::{Scalars, Term};
use crate::types::DType;
use num_traits::Float;
use std::sync::OnceLock;

/// Declares an op enum: variants, `ALL`, mnemonics and their lookup.
macro_rules! op_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $mnemonic:ident,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every op of the family, in table order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The text mnemonic.
            pub fn mnemonic(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($mnemonic),)*
                }
            }

            /// Looks an op up by mnemonic.
            pub fn from_mnemonic(s: &str) -> Option<$name> {
                match s {
                    $(stringify!($mnemonic) => Some($name::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

/// A closure computing a primitive op on scalars, for [`UnaryPrim::specialize`] and
/// [`BinaryPrim::specialize`].
macro_rules! scalar_fn {
    (unary, $op:expr) => {
        |x: f32| $op.apply(x)
    };
    (binary, $op:expr) => {
        |x: f32, y: f32| $op.apply(x, y)
    };
    (unary, $op:expr, $t:ident) => {
        |x: $t| $t::unary($op, x)
    };
    (binary, $op:expr, $t:ident) => {
        |x: $t, y: $t| $t::binary($op, x, y)
    };
}

/// Declares an elementwise family: the enum of every op (primitives, then composites), the
/// enum of its primitives (what code generators match on), the rows, and `$each!`, a
/// macro that hands every `(doc, Variant, mnemonic)` to a callback (the Tensor methods).
macro_rules! op_table {
    (
        $d:tt $arity:ident, $each:ident, $kernel:ident, $kernel_as:ident;
        $(#[$meta:meta])* $name:ident / $prim:ident : $row:ident {
            $($(#[$pmeta:meta])* $pvariant:ident = $pmn:ident, weight $weight:literal => $prow:expr,)*
        }
        composites {
            $($(#[$cmeta:meta])* $cvariant:ident = $cmn:ident, expand $expand:literal => $crow:expr,)*
        }
    ) => {
        op_enum! {
            $(#[$meta])* $name { $($(#[$pmeta])* $pvariant = $pmn,)* $($(#[$cmeta])* $cvariant = $cmn,)* }
        }

        op_enum! {
            #[doc = concat!("The primitive ops of [`", stringify!($name), "`]: those code generators implement.")]
            $prim { $($(#[$pmeta])* $pvariant = $pmn,)* }
        }

        /// Hands every op of the family to `$callback!` as `doc-attributes Variant mnemonic;`.
        #[macro_export]
        macro_rules! $each {
            ($d callback:ident) => {
                $d callback! { $($(#[$pmeta])* $pvariant $pmn;)* $($(#[$cmeta])* $cvariant $cmn;)* }
            };
        }

        impl $name {
            /// The op's row.
            pub fn row(self) -> &'static $row {
                static ROWS: &[$row] = &[$($prow,)* $($crow,)*];
                &ROWS[self as usize]
            }

            /// A primitive, or a composite's expansion.
            pub fn def(self) -> OpDef<$prim> {
                static EXPANSIONS: OnceLock<Vec<Term>> = OnceLock::new();
                const TEXTS: &[&str] = &[$($expand,)*];
                #[allow(unreachable_patterns)] // a family with no composites
                match self {
                    $($name::$pvariant => OpDef::Prim($prim::$pvariant),)*
                    _ => {
                        let all = EXPANSIONS.get_or_init(|| TEXTS.iter().map(|f| table_formula(f)).collect());
                        OpDef::Composite(&all[self as usize - $prim::ALL.len()])
                    }
                }
            }

            /// Relative cost of one element (an add is 1); a composite costs its expansion.
            pub fn weight(self) -> f64 {
                match self.def() {
                    OpDef::Prim(p) => p.weight(),
                    OpDef::Composite(t) => t.weight(),
                }
            }

            /// Whether it costs much more than a load and a store (transcendental functions,
            /// division, square roots): worth computing once rather than again per read.
            pub fn is_costly(self) -> bool {
                self.weight() > 2.0
            }
        }

        impl $prim {
            /// The op of the whole family.
            pub fn op(self) -> $name {
                match self {
                    $($prim::$pvariant => $name::$pvariant,)*
                }
            }

            /// Relative cost of one element (an add is 1).
            pub fn weight(self) -> f64 {
                match self {
                    $($prim::$pvariant => $weight,)*
                }
            }

            /// Calls `kernel` with this op's scalar function as a closure of its own type, so
            /// a loop the kernel writes around it is compiled once per op, with no dispatch
            /// per element.
            pub fn specialize<R>(self, kernel: impl $kernel<R>) -> R {
                match self {
                    $($prim::$pvariant => kernel.call(scalar_fn!($arity, $prim::$pvariant)),)*
                }
            }

            /// [`Self::specialize`] in another scalar type than `f32` (`f64` tensors, and
            /// integer ones, which wrap).
            pub fn specialize_as<T: Scalar, R>(self, kernel: impl $kernel_as<T, R>) -> R {
                match self {
                    $($prim::$pvariant => kernel.call(scalar_fn!($arity, $prim::$pvariant, T)),)*
                }
            }
        }
    };
}

/// What an op is: a primitive (code generators implement it) or a composite (a formula over
/// primitives, with `Var::Operand` for its operands).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OpDef<P> {
    /// Implemented by every backend.
    Prim(P),
    /// Its expansion.
    Composite(&'static Term),
}

/// Which dtypes an op computes in (PyTorch's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Any number, integers too, in the operands' promoted dtype; not `bool`.
    Numeric,
    /// Floating point: integer and `bool` operands give a [`DType::DEFAULT_FLOAT`] result
    /// (`exp` of an `i32`, and true division `/` of integers, are `f32`).
    Float,
}

impl Domain {
    /// The dtype the op computes in and gives, for operands promoted to `dtype`, or `None`
    /// when it does not take them.
    pub fn compute(self, dtype: DType) -> Option<DType> {
        match self {
            Domain::Numeric if dtype == DType::Bool => None,
            Domain::Numeric => Some(dtype),
            Domain::Float if dtype.is_float() => Some(dtype),
            Domain::Float => Some(DType::DEFAULT_FLOAT),
        }
    }
}

/// A row of [`UnaryOp`]'s table.
#[derive(Debug)]
pub struct UnaryRow {
    /// The dtypes it takes; the result has the operand's type.
    pub domain: Domain,
    /// The gradient of its operand, over `x` (the operand), `y` (the result) and `g` (the
    /// result's gradient).
    pub grad: &'static str,
}

/// A row of [`BinaryOp`]'s table.
#[derive(Debug)]
pub struct BinaryRow {
    /// The dtypes it takes.
    pub domain: Domain,
    /// A comparison: its result is a truth value (1.0/0.0 today) and it has no gradient.
    pub compare: bool,
    /// The gradients of its operands `a` and `b`, over `a`, `b`, `y` and `g`; `None` for
    /// ops with no gradient.
    pub grads: Option<[&'static str; 2]>,
}

/// A kernel over a unary scalar function, for [`UnaryPrim::specialize`].
pub trait UnaryKernel<R> {
    /// Runs the kernel with the op's function.
    fn call<F: Fn(f32) -> f32 + Copy + Send + Sync>(self, f: F) -> R;
}

/// A kernel over a binary scalar function, for [`BinaryPrim::specialize`].
pub trait BinaryKernel<R> {
    /// Runs the kernel with the op's function.
    fn call<F: Fn(f32, f32) -> f32 + Copy + Send + Sync>(self, f: F) -> R;
}

/// A kernel over a unary scalar function in `T`, for [`UnaryPrim::specialize_as`].
pub trait UnaryKernelAs<T, R> {
    /// Runs the kernel with the op's function.
    fn call<F: Fn(T) -> T + Copy + Send + Sync>(self, f: F) -> R;
}

/// A kernel over a binary scalar function in `T`, for [`BinaryPrim::specialize_as`].
pub trait BinaryKernelAs<T, R> {
    /// Runs the kernel with the op's function.
    fn call<F: Fn(T, T) -> T + Copy + Send + Sync>(self, f: F) -> R;
}

/// A scalar type an elementwise op computes in, with each primitive's semantics in it:
/// `f64`'s `apply_f64`, and for integers `apply_int` (wrapping; an `i32` op computed in `i64`
/// and wrapped back, which is `i32`'s own wrapping arithmetic; a float-only op, which the
/// type rules never give integers, is 0). Comparisons give 1 or 0.
pub trait Scalar: Copy + PartialEq + Send + Sync + 'static {
    /// Zero (what a comparison gives for false).
    const ZERO: Self;
    /// `p` on `x`.
    fn unary(p: UnaryPrim, x: Self) -> Self;
    /// `p` on `x` and `y`.
    fn binary(p: BinaryPrim, x: Self, y: Self) -> Self;
}

impl Scalar for f64 {
    const ZERO: f64 = 0.0;
    #[inline]
    fn unary(p: UnaryPrim, x: f64) -> f64 {
        p.apply_f64(x)
    }
    #[inline]
    fn binary(p: BinaryPrim, x: f64, y: f64) -> f64 {
        p.apply_f64(x, y)
    }
}

impl Scalar for i64 {
    const ZERO: i64 = 0;
    #[inline]
    fn unary(p: UnaryPrim, x: i64) -> i64 {
        p.apply_int(x).unwrap_or_default()
    }
    #[inline]
    fn binary(p: BinaryPrim, x: i64, y: i64) -> i64 {
        p.apply_int(x, y).unwrap_or_default()
    }
}

impl Scalar for i32 {
    const ZERO: i32 = 0;
    #[inline]
    fn unary(p: UnaryPrim, x: i32) -> i32 {
        i64::unary(p, i64::from(x)) as i32
    }
    #[inline]
    fn binary(p: BinaryPrim, x: i32, y: i32) -> i32 {
        i64::binary(p, i64::from(x), i64::from(y)) as i32
    }
}

/// A formula of the table, parsed (rows are ours, and a test parses every one).
fn table_formula(text: &str) -> Term {
    Term::parse(text).unwrap_or_else(|e| panic!("the op table has a bad formula: {e}"))
}

/// Parses one formula per op, once.
fn formulas<const N: usize>(
    cache: &'static OnceLock<Vec<[Term; N]>>,
    rows: impl Iterator<Item = [&'static str; N]>,
) -> &'static [[Term; N]] {
    cache.get_or_init(|| rows.map(|r| r.map(table_formula)).collect())
}

op_table! {
    $ unary, each_unary_op, UnaryKernel, UnaryKernelAs;
    /// Elementwise ops of one operand; the result has the operand's type.
    UnaryOp / UnaryPrim : UnaryRow {
        /// `-x`
        Neg = neg, weight 1.0 => UnaryRow { domain: Domain::Numeric, grad: "(neg g)" },
        /// `|x|`
        Abs = abs, weight 1.0 => UnaryRow { domain: Domain::Numeric, grad: "(mul g (sub (gt x 0) (lt x 0)))" },
        /// `max(x, 0)`
        Relu = relu, weight 1.0 => UnaryRow { domain: Domain::Numeric, grad: "(mul g (gt x 0))" },
        /// `1 / (1 + exp(-x))`
        Sigmoid = sigmoid, weight 8.0 => UnaryRow { domain: Domain::Float, grad: "(mul (mul (sub 1 y) y) g)" },
        /// hyperbolic tangent
        Tanh = tanh, weight 8.0 => UnaryRow { domain: Domain::Float, grad: "(mul (sub 1 (mul y y)) g)" },
        /// `e^x`
        Exp = exp, weight 8.0 => UnaryRow { domain: Domain::Float, grad: "(mul g y)" },
        /// natural logarithm
        Log = log, weight 8.0 => UnaryRow { domain: Domain::Float, grad: "(div g x)" },
        /// square root
        Sqrt = sqrt, weight 4.0 => UnaryRow { domain: Domain::Float, grad: "(div g (mul y 2))" },
        /// `1 / sqrt(x)`
        Rsqrt = rsqrt, weight 4.0 => UnaryRow { domain: Domain::Float, grad: "(mul (mul (div y x) -0.5) g)" },
        /// the error function, `2/sqrt(pi) * integral from 0 to x of exp(-t^2)`
        Erf = erf, weight 8.0 => UnaryRow {
            domain: Domain::Float,
            grad: "(mul g (mul (exp (neg (mul x x))) 1.1283791670955126))",
        },
    }
    composites {
        /// `log(1 + e^x)`, as `max(x, 0) + log(1 + exp(-|x|))` so that it never overflows
        Softplus = softplus, expand "(add (maximum x 0) (log (add 1 (exp (neg (abs x))))))" => UnaryRow {
            domain: Domain::Float,
            grad: "(mul g (sigmoid x))",
        },
    }
}

op_table! {
    $ binary, each_binary_op, BinaryKernel, BinaryKernelAs;
    /// Elementwise ops of two operands with NumPy broadcasting. Comparisons give `bool`
    /// tensors (1.0 and 0.0 inside a fused kernel and in formulas).
    BinaryOp / BinaryPrim : BinaryRow {
        /// `a + b`
        Add = add, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: false, grads: Some(["g", "g"]) },
        /// `a - b`
        Sub = sub, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: false, grads: Some(["g", "(neg g)"]) },
        /// `a * b`
        Mul = mul, weight 1.0 => BinaryRow {
            domain: Domain::Numeric,
            compare: false,
            grads: Some(["(mul g b)", "(mul g a)"]),
        },
        /// `a / b`, true division (integers give floats, as in PyTorch)
        Div = div, weight 4.0 => BinaryRow {
            domain: Domain::Float,
            compare: false,
            grads: Some(["(div g b)", "(neg (div (mul g y) b))"]),
        },
        /// `a ^ b` (any real exponent)
        Pow = pow, weight 16.0 => BinaryRow {
            domain: Domain::Float,
            compare: false,
            // `b a^(b-1)` taken as 0 where b == 0, and `a^b ln a` as 0 where a == 0 and
            // b >= 0 (0 * inf would be NaN), as PyTorch does.
            grads: Some([
                "(mul (where (eq b 0) 0 (mul (pow a (sub b 1)) b)) g)",
                "(mul (where (eq a 0) (where (ge b 0) 0 (mul y -inf)) (mul y (log a))) g)",
            ]),
        },
        /// larger of the two
        Maximum = maximum, weight 1.0 => BinaryRow {
            domain: Domain::Numeric,
            compare: false,
            // Ties share the gradient equally (as PyTorch).
            grads: Some([
                "(mul g (add (gt a b) (mul (eq a b) 0.5)))",
                "(sub g (mul g (add (gt a b) (mul (eq a b) 0.5))))",
            ]),
        },
        /// smaller of the two
        Minimum = minimum, weight 1.0 => BinaryRow {
            domain: Domain::Numeric,
            compare: false,
            grads: Some([
                "(mul g (add (lt a b) (mul (eq a b) 0.5)))",
                "(sub g (mul g (add (lt a b) (mul (eq a b) 0.5))))",
            ]),
        },
        /// `a == b`
        Eq = eq, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: true, grads: None },
        /// `a != b`
        Ne = ne, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: true, grads: None },
        /// `a < b`
        Lt = lt, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: true, grads: None },
        /// `a <= b`
        Le = le, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: true, grads: None },
        /// `a > b`
        Gt = gt, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: true, grads: None },
        /// `a >= b`
        Ge = ge, weight 1.0 => BinaryRow { domain: Domain::Numeric, compare: true, grads: None },
    }
    composites {}
}

op_enum! {
    /// Reductions over a set of axes (all axes when none are given).
    ReduceOp {
        /// sum
        Sum = sum,
        /// arithmetic mean
        Mean = mean,
        /// maximum
        Max = max,
        /// minimum
        Min = min,
    }
}

impl UnaryOp {
    /// Whether computing it computes the binary primitive `prim` (in its expansion).
    pub fn uses(self, prim: BinaryPrim) -> bool {
        match self.def() {
            OpDef::Prim(_) => false,
            OpDef::Composite(t) => t.uses(prim),
        }
    }

    /// The gradient of the operand (see [`UnaryRow::grad`]).
    pub fn gradient(self) -> &'static Term {
        static CACHE: OnceLock<Vec<[Term; 1]>> = OnceLock::new();
        &formulas(&CACHE, UnaryOp::ALL.iter().map(|op| [op.row().grad]))[self as usize][0]
    }

    /// The op on one `f32` (the interpreter's semantics; constant folding uses it).
    pub fn apply(self, x: f32) -> f32 {
        match self.def() {
            OpDef::Prim(p) => p.apply(x),
            OpDef::Composite(t) => match t.eval(&mut Scalars { operands: &[x] }) {
                Ok(v) => v,
                Err(never) => match never {},
            },
        }
    }
}

impl UnaryOp {
    /// The op on one `f64` (`f64` tensors' semantics).
    pub fn apply_f64(self, x: f64) -> f64 {
        match self.def() {
            OpDef::Prim(p) => p.apply_f64(x),
            OpDef::Composite(t) => match t.eval(&mut Scalars { operands: &[x] }) {
                Ok(v) => v,
                Err(never) => match never {},
            },
        }
    }

    /// The op on one integer, wrapping on overflow as PyTorch's integer tensors do (`None`
    /// for a float-only op, which the type rules never give integers).
    #[inline]
    pub fn apply_int(self, x: i64) -> Option<i64> {
        match self.def() {
            OpDef::Prim(p) => p.apply_int(x),
            OpDef::Composite(_) => None,
        }
    }
}

impl BinaryOp {
    /// The op on two `f64`s (`f64` tensors' semantics; comparisons give 0 or 1).
    pub fn apply_f64(self, x: f64, y: f64) -> f64 {
        match self.def() {
            OpDef::Prim(p) => p.apply_f64(x, y),
            OpDef::Composite(t) => match t.eval(&mut Scalars { operands: &[x, y] }) {
                Ok(v) => v,
                Err(never) => match never {},
            },
        }
    }

    /// The op on two integers, wrapping on overflow (comparisons give 0 or 1; `None` for a
    /// float-only op).
    #[inline]
    pub fn apply_int(self, x: i64, y: i64) -> Option<i64> {
        let OpDef::Prim(p) = self.def() else { return None };
        p.apply_int(x, y)
    }
}

impl BinaryPrim {
    /// The primitive on two integers, wrapping on overflow (comparisons give 0 or 1; `None`
    /// for a float-only one).
    #[inline]
    pub fn apply_int(self, x: i64, y: i64) -> Option<i64> {
        Some(match self {
            BinaryPrim::Add => x.wrapping_add(y),
            BinaryPrim::Sub => x.wrapping_sub(y),
            BinaryPrim::Mul => x.wrapping_mul(y),
            BinaryPrim::Maximum => x.max(y),
            BinaryPrim::Minimum => x.min(y),
            BinaryPrim::Eq => i64::from(x == y),
            BinaryPrim::Ne => i64::from(x != y),
            BinaryPrim::Lt => i64::from(x < y),
            BinaryPrim::Le => i64::from(x <= y),
            BinaryPrim::Gt => i64::from(x > y),
            BinaryPrim::Ge => i64::from(x >= y),
            BinaryPrim::Div | BinaryPrim::Pow => return None,
        })
    }
}

impl BinaryOp {
    /// Whether computing it computes the primitive `prim` (itself, or in its expansion).
    pub fn uses(self, prim: BinaryPrim) -> bool {
        match self.def() {
            OpDef::Prim(p) => p == prim,
            OpDef::Composite(t) => t.uses(prim),
        }
    }

    /// The gradients of both operands (see [`BinaryRow::grads`]).
    pub fn gradients(self) -> Option<&'static [Term; 2]> {
        static CACHE: OnceLock<Vec<[Term; 2]>> = OnceLock::new();
        let all = formulas(&CACHE, BinaryOp::ALL.iter().map(|op| op.row().grads.unwrap_or(["0", "0"])));
        self.row().grads.map(|_| &all[self as usize])
    }

    /// Comparisons give 0/1 and have no gradient.
    pub fn is_comparison(self) -> bool {
        self.row().compare
    }

    /// The op on two `f32`s (the interpreter's semantics; constant folding uses it).
    pub fn apply(self, x: f32, y: f32) -> f32 {
        match self.def() {
            OpDef::Prim(p) => p.apply(x, y),
            OpDef::Composite(t) => match t.eval(&mut Scalars { operands: &[x, y] }) {
                Ok(v) => v,
                Err(never) => match never {},
            },
        }
    }
}

impl UnaryPrim {
    /// The primitive on one integer, wrapping on overflow as PyTorch's integer tensors do
    /// (`None` for a float-only one).
    #[inline]
    pub fn apply_int(self, x: i64) -> Option<i64> {
        match self {
            UnaryPrim::Neg => Some(x.wrapping_neg()),
            UnaryPrim::Abs => Some(x.wrapping_abs()),
            UnaryPrim::Relu => Some(x.max(0)),
            _ => None,
        }
    }

    // The scalar `apply*` functions (here, on `BinaryPrim`, and `apply_int` on the op enums)
    // are `#[inline]`: inlined into other crates' loops (the interpreter's), the op is a
    // constant there and the loop vectorizes.
    /// The op on one `f32`: the reference semantics.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        self.apply_real(x, libm::erff)
    }

    /// The op on one `f64`: the transcendental ones are [`crate::math64`]'s, which every
    /// backend computes alike.
    #[inline]
    pub fn apply_f64(self, x: f64) -> f64 {
        use crate::math64::one;
        match self {
            UnaryPrim::Exp => one::exp(x),
            UnaryPrim::Log => one::ln(x),
            UnaryPrim::Tanh => one::tanh(x),
            UnaryPrim::Sigmoid => one::sigmoid(x),
            UnaryPrim::Erf => one::erf(x),
            _ => self.apply_real(x, libm::erf),
        }
    }

    /// The op in any float type (`erf` from libm at that precision).
    fn apply_real<T: Float>(self, x: T, erf: fn(T) -> T) -> T {
        match self {
            UnaryPrim::Neg => -x,
            UnaryPrim::Abs => x.abs(),
            // `x < 0` is false for NaN, which therefore passes through as in PyTorch.
            UnaryPrim::Relu => {
                if x < T::zero() {
                    T::zero()
                } else {
                    x
                }
            }
            UnaryPrim::Sigmoid => sigmoid(x),
            UnaryPrim::Tanh => x.tanh(),
            UnaryPrim::Exp => x.exp(),
            UnaryPrim::Log => x.ln(),
            UnaryPrim::Sqrt => x.sqrt(),
            UnaryPrim::Rsqrt => T::one() / x.sqrt(),
            UnaryPrim::Erf => erf(x),
        }
    }
}

impl BinaryPrim {
    /// The op on two `f32`s: the reference semantics (comparisons give 0 or 1).
    #[inline]
    pub fn apply(self, x: f32, y: f32) -> f32 {
        self.apply_real(x, y)
    }

    /// The op on two `f64`s.
    #[inline]
    pub fn apply_f64(self, x: f64, y: f64) -> f64 {
        self.apply_real(x, y)
    }

    fn apply_real<T: Float>(self, x: T, y: T) -> T {
        match self {
            BinaryPrim::Add => x + y,
            BinaryPrim::Sub => x - y,
            BinaryPrim::Mul => x * y,
            BinaryPrim::Div => x / y,
            BinaryPrim::Pow => x.powf(y),
            BinaryPrim::Maximum => nan_max(x, y),
            BinaryPrim::Minimum => nan_min(x, y),
            BinaryPrim::Eq => truth(x == y),
            BinaryPrim::Ne => truth(x != y),
            BinaryPrim::Lt => truth(x < y),
            BinaryPrim::Le => truth(x <= y),
            BinaryPrim::Gt => truth(x > y),
            BinaryPrim::Ge => truth(x >= y),
        }
    }
}

/// `erf(x)` as the code generators approximate it (Eigen's and XLA's rational function): `x`
/// clamped to `[-4, 4]` (beyond, `erf` is `+-1` in `f32`), then
/// `x * p(x^2) / q(x^2)` with these coefficients, highest power first (Horner); within 8
/// ulp of libm's `erff` (absolute error < 5e-7).
pub const ERF_NUMERATOR: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_600_2e-3,
    -1.609_603_3e-2,
];
/// The denominator of [`ERF_NUMERATOR`]'s rational function.
pub const ERF_DENOMINATOR: [f32; 5] = [-1.456_607_2e-5, -2.133_740_6e-4, -1.682_827e-3, -7.373_329e-3, -1.426_474e-2];

/// The logistic function, without overflowing `exp` for large `|x|`.
pub fn sigmoid<T: Float>(x: T) -> T {
    if x < T::zero() {
        let e = x.exp();
        e / (T::one() + e)
    } else {
        T::one() / (T::one() + (-x).exp())
    }
}

/// 1 for true, 0 for false (what comparisons give inside kernels and formulas).
pub fn truth<T: Float>(b: bool) -> T {
    if b {
        T::one()
    } else {
        T::zero()
    }
}

/// The larger of two values; NaN if either is (like `numpy.maximum`).
pub fn nan_max<T: Float>(x: T, y: T) -> T {
    if x >= y || x.is_nan() {
        x
    } else {
        y
    }
}

/// The smaller of two values; NaN if either is (like `numpy.minimum`).
pub fn nan_min<T: Float>(x: T, y: T) -> T {
    if x <= y || x.is_nan() {
        x
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formula::Var;

    #[test]
    fn every_formula_parses_and_reads_only_its_variables() {
        for &op in UnaryOp::ALL {
            let g = op.gradient();
            assert!(!g.reads(Var::Operand(1)), "{op:?}: {g}");
            if let OpDef::Composite(t) = op.def() {
                assert!(!t.reads(Var::Result) && !t.reads(Var::Grad) && !t.reads(Var::Operand(1)), "{op:?}");
            }
        }
        for &op in BinaryOp::ALL {
            assert_eq!(op.gradients().is_none(), op.is_comparison(), "{op:?}");
        }
    }

    #[test]
    fn mnemonics_round_trip_and_primitives_come_first() {
        for &op in UnaryOp::ALL {
            assert_eq!(UnaryOp::from_mnemonic(op.mnemonic()), Some(op));
        }
        for &p in UnaryPrim::ALL {
            assert_eq!(UnaryOp::ALL[p as usize], p.op());
            assert_eq!(p.op().def(), OpDef::Prim(p));
        }
        for &p in BinaryPrim::ALL {
            assert_eq!(p.op().mnemonic(), p.mnemonic());
        }
    }

    #[test]
    fn mnemonics_are_unique_across_families() {
        let mut all: Vec<&str> = UnaryOp::ALL.iter().map(|o| o.mnemonic()).collect();
        all.extend(BinaryOp::ALL.iter().map(|o| o.mnemonic()));
        all.extend(ReduceOp::ALL.iter().map(|o| o.mnemonic()));
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(UnaryOp::Softplus.uses(BinaryPrim::Maximum) && !UnaryOp::Softplus.uses(BinaryPrim::Pow));
        assert!(BinaryOp::Pow.uses(BinaryPrim::Pow) && !UnaryOp::Exp.uses(BinaryPrim::Pow));
    }

    #[test]
    fn softplus_is_its_expansion() {
        for x in [-100.0f32, -3.0, -0.5, 0.0, 0.5, 3.0, 100.0] {
            let want = (x as f64).exp().ln_1p().max(x as f64) as f32;
            let got = UnaryOp::Softplus.apply(x);
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "softplus({x}) = {got}, want {want}");
        }
        assert!(UnaryOp::Softplus.is_costly() && UnaryOp::Softplus.weight() > UnaryOp::Log.weight());
    }

    #[test]
    fn specialize_calls_the_op() {
        struct At(f32, f32);
        impl BinaryKernel<f32> for At {
            fn call<F: Fn(f32, f32) -> f32 + Copy + Send + Sync>(self, f: F) -> f32 {
                f(self.0, self.1)
            }
        }
        for &p in BinaryPrim::ALL {
            assert_eq!(p.specialize(At(3.0, 2.0)).to_bits(), p.apply(3.0, 2.0).to_bits());
        }
    }
}
