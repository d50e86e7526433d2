//! The op tables: one row per elementwise/reduction op (mnemonic and doc), from which the
//! parser, printer and verifier dispatch. Adding such an op is one row here plus its
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
