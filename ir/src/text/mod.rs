//! The `.gtir` text format: lexer, parser and printer, and the parse error type.
//! `parse(&print(p)) == p` for every program (spans aside); see `docs/gtir.md`.

pub mod lexer;
pub mod parse;
pub mod print;

pub use parse::{parse, parse_bytes};
pub use print::{print, print_instr, print_with_types};

use crate::Span;
use thiserror::Error;

/// A syntax error at a place in the source.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{kind}")]
pub struct ParseError {
    /// Where.
    pub span: Span,
    /// What.
    pub kind: ParseErrorKind,
}

/// What is wrong with the text.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ParseErrorKind {
    /// Bytes that are not UTF-8.
    #[error("file is not valid UTF-8 (first bad byte at offset {offset})")]
    NotUtf8 {
        /// Byte offset of the first bad byte.
        offset: usize,
    },
    /// A character that starts no token.
    #[error("unexpected character {ch:?}")]
    UnexpectedChar {
        /// The character.
        ch: char,
    },
    /// `%` with no name.
    #[error("`%` must be followed by a name, as in `%x` or `%0`")]
    EmptyValueName,
    /// A string with no closing quote on its line.
    #[error("unterminated string (strings end with `\"` on the same line)")]
    UnterminatedString,
    /// An escape other than `\"`, `\\`, `\n`.
    #[error("unknown escape in string (only \\\", \\\\ and \\n)")]
    BadEscape,
    /// A malformed number.
    #[error("malformed number `{text}`")]
    BadNumber {
        /// As written.
        text: String,
    },
    /// A tensor element its dtype cannot hold.
    #[error("`{text}` is not a {dtype} element: {reason}")]
    BadElement {
        /// As written.
        text: String,
        /// The tensor's dtype.
        dtype: crate::DType,
        /// Why not.
        reason: &'static str,
    },
    /// An integer scalar (an operand, `full`'s value) that `f64`, which holds scalars,
    /// would round.
    #[error("integer scalar `{text}` is beyond 2^53, where scalars (held as f64) round: write it as a tensor literal")]
    InexactScalar {
        /// As written.
        text: String,
    },
    /// An integer beyond `i64`.
    #[error("integer `{text}` is too large")]
    IntegerOverflow {
        /// As written.
        text: String,
    },
    /// Something other than what the grammar allows here.
    #[error("expected {expected}, found {found}")]
    Expected {
        /// What the grammar allows.
        expected: &'static str,
        /// What is there (a token described, or the text as written).
        found: String,
    },
    /// Something other than a whole number where one is needed.
    #[error("expected {what} (an integer >= 0), found {found}")]
    ExpectedUint {
        /// What the number is.
        what: &'static str,
        /// What is there.
        found: String,
    },
    /// A word that starts no statement.
    #[error("unknown statement `{word}`")]
    UnknownStatement {
        /// The word.
        word: String,
        /// A close keyword or op.
        suggestion: Option<String>,
    },
    /// An op used without `%result =`.
    #[error("`{op}` gives a value: write `%result = {op} ...`")]
    MissingResult {
        /// The op.
        op: String,
    },
    /// An op name nobody defined.
    #[error("unknown op `{name}`")]
    UnknownOp {
        /// The word.
        name: String,
        /// A close mnemonic.
        suggestion: Option<String>,
    },
    /// The wrong number of operands.
    #[error("`{op}` takes {expected} operand(s), found {found}")]
    Arity {
        /// The op.
        op: String,
        /// How many it takes.
        expected: OperandCount,
        /// How many were given.
        found: usize,
    },
    /// The wrong number of results.
    #[error("`{op}` gives one result, found {found} names")]
    ResultCount {
        /// The op.
        op: String,
        /// Names given.
        found: usize,
    },
    /// A number where the op needs a value.
    #[error("operand {index} of `{op}` must be a value like `%x`, not a number")]
    OperandKind {
        /// The op.
        op: String,
        /// Operand position.
        index: usize,
    },
    /// An attribute the op does not take.
    #[error("`{op}` has no attribute `{name}` (it takes: {})", if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") })]
    UnknownAttr {
        /// The op.
        op: String,
        /// The attribute.
        name: String,
        /// The ones it takes.
        allowed: Vec<&'static str>,
        /// A close attribute name.
        suggestion: Option<String>,
    },
    /// A required attribute left out.
    #[error("`{op}` needs attribute `{name}`")]
    MissingAttr {
        /// The op.
        op: String,
        /// The attribute.
        name: &'static str,
    },
    /// An attribute given twice.
    #[error("attribute `{name}` is given twice")]
    DuplicateAttr {
        /// The attribute.
        name: String,
    },
    /// Two attributes that exclude each other.
    #[error("`{op}` takes `{a}` or `{b}`, not both")]
    ConflictingAttrs {
        /// The op.
        op: String,
        /// One.
        a: &'static str,
        /// The other.
        b: &'static str,
    },
    /// An attribute value of the wrong kind.
    #[error("attribute `{name}` of `{op}` must be {expected}")]
    AttrKind {
        /// The op.
        op: String,
        /// The attribute.
        name: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A dtype name nobody defined.
    #[error("unknown dtype `{name}` (known: {})", known_dtypes())]
    UnknownDType {
        /// The word.
        name: String,
        /// A close dtype.
        suggestion: Option<String>,
    },
    /// A constant used before (or without) its `const`.
    #[error("unknown constant `{name}` (declare it first with `const {name} = ...`)")]
    UnknownConst {
        /// The word.
        name: String,
        /// A close constant.
        suggestion: Option<String>,
    },
    /// A constant declared twice.
    #[error("constant `{name}` is already declared")]
    DuplicateConst {
        /// The name.
        name: String,
    },
    /// Blocks or brackets nested too deeply.
    #[error("nesting deeper than {limit} levels")]
    NestingTooDeep {
        /// The limit.
        limit: usize,
    },
    /// A `}` with no open block.
    #[error("`}}` without an open block")]
    UnmatchedBrace,
    /// A `fused` kernel with no closing `}`.
    #[error("the kernel has no closing `}}`")]
    UnterminatedKernel,
    /// A `fused` kernel whose text does not parse (the span is the kernel's line).
    #[error("in the kernel: {source}")]
    Kernel {
        /// What is wrong.
        #[source]
        source: crate::kernel::text::KernelTextError,
    },
}

/// How many operands an op takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperandCount {
    /// Exactly this many.
    Exactly(usize),
    /// This many or more.
    AtLeast(usize),
}

impl std::fmt::Display for OperandCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OperandCount::Exactly(n) => write!(f, "{n}"),
            OperandCount::AtLeast(n) => write!(f, "at least {n}"),
        }
    }
}

impl ParseError {
    /// A hint for the user, when there is a likely fix.
    pub fn help(&self) -> Option<String> {
        use ParseErrorKind::*;
        match &self.kind {
            UnknownOp { suggestion: Some(s), .. }
            | UnknownStatement { suggestion: Some(s), .. }
            | UnknownDType { suggestion: Some(s), .. }
            | UnknownConst { suggestion: Some(s), .. }
            | UnknownAttr { suggestion: Some(s), .. } => Some(format!("did you mean `{s}`?")),
            UnknownOp { suggestion: None, .. } => Some(format!("known ops: {}", parse::mnemonics().join(", "))),
            _ => None,
        }
    }
}

/// Every dtype's name, for the error naming an unknown one (from [`DType::ALL`], so a new
/// dtype is listed without touching this).
fn known_dtypes() -> String {
    crate::DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}
