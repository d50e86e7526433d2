//! The op tables: one row per elementwise/reduction op (mnemonic and doc), from which the
//! parser, printer and verifier dispatch, and each elementwise op's value on scalars
//! (`apply`: the interpreter's semantics, which every backend and constant folding follow).
//! Adding such an op is one row here plus its
//! semantics in the interpreter (`runtime/src/backend/cpu/interp.rs`) and one filetest.

/// Declares an op family: an enum, its mnemonic table and lookups.
macro_rules! op_table {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $mnemonic:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every op of the family, in table order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The text mnemonic.
            pub fn mnemonic(self) -> &'static str {
                match self {
                    $($name::$variant => $mnemonic,)*
                }
            }

            /// Looks an op up by mnemonic.
            pub fn from_mnemonic(s: &str) -> Option<$name> {
                match s {
                    $($mnemonic => Some($name::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

op_table! {
    /// Elementwise ops of one operand; the result has the operand's type.
    UnaryOp {
        /// `-x`
        Neg = "neg",
        /// `|x|`
        Abs = "abs",
        /// `max(x, 0)`
        Relu = "relu",
        /// `1 / (1 + exp(-x))`
        Sigmoid = "sigmoid",
        /// hyperbolic tangent
        Tanh = "tanh",
        /// `e^x`
        Exp = "exp",
        /// natural logarithm
        Log = "log",
        /// square root
        Sqrt = "sqrt",
        /// `1 / sqrt(x)`
        Rsqrt = "rsqrt",
    }
}

op_table! {
    /// Elementwise ops of two operands with NumPy broadcasting. Comparisons give 1.0 where
    /// true and 0.0 where false, in the operands' dtype.
    BinaryOp {
        /// `a + b`
        Add = "add",
        /// `a - b`
        Sub = "sub",
        /// `a * b`
        Mul = "mul",
        /// `a / b`
        Div = "div",
        /// `a ^ b` (any real exponent)
        Pow = "pow",
        /// larger of the two
        Maximum = "maximum",
        /// smaller of the two
        Minimum = "minimum",
        /// `a == b`
        Eq = "eq",
        /// `a != b`
        Ne = "ne",
        /// `a < b`
        Lt = "lt",
        /// `a <= b`
        Le = "le",
        /// `a > b`
        Gt = "gt",
        /// `a >= b`
        Ge = "ge",
    }
}

impl BinaryOp {
    /// Comparisons give 0/1 and have zero gradient.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }
}

op_table! {
    /// Reductions over a set of axes (all axes when none are given).
    ReduceOp {
        /// sum
        Sum = "sum",
        /// arithmetic mean
        Mean = "mean",
        /// maximum
        Max = "max",
        /// minimum
        Min = "min",
    }
}

/// The logistic function, without overflowing `exp` for large `|x|`.
pub fn sigmoid(x: f32) -> f32 {
    if x < 0.0 {
        let e = x.exp();
        e / (1.0 + e)
    } else {
        1.0 / (1.0 + (-x).exp())
    }
}

/// 1.0 for true, 0.0 for false (what comparisons give).
pub fn truth(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// The larger of two values; NaN if either is (like `numpy.maximum`).
pub fn nan_max(x: f32, y: f32) -> f32 {
    if x >= y || x.is_nan() {
        x
    } else {
        y
    }
}

/// The smaller of two values; NaN if either is (like `numpy.minimum`).
pub fn nan_min(x: f32, y: f32) -> f32 {
    if x <= y || x.is_nan() {
        x
    } else {
        y
    }
}

impl UnaryOp {
    /// The op on one `f32` (the interpreter's semantics; constant folding uses it).
    pub fn apply(self, x: f32) -> f32 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            // `x < 0` is false for NaN, which therefore passes through as in PyTorch.
            UnaryOp::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            UnaryOp::Sigmoid => sigmoid(x),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        }
    }
}

impl BinaryOp {
    /// The op on two `f32`s (the interpreter's semantics; constant folding uses it).
    pub fn apply(self, x: f32, y: f32) -> f32 {
        match self {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Pow => x.powf(y),
            BinaryOp::Maximum => nan_max(x, y),
            BinaryOp::Minimum => nan_min(x, y),
            BinaryOp::Eq => truth(x == y),
            BinaryOp::Ne => truth(x != y),
            BinaryOp::Lt => truth(x < y),
            BinaryOp::Le => truth(x <= y),
            BinaryOp::Gt => truth(x > y),
            BinaryOp::Ge => truth(x >= y),
        }
    }
}
