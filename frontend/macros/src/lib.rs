//! gt-macros: the `gt!` macro. A tensor program written in `.gtir` instruction syntax inside
//! Rust, lowered at compile time to `gt_ir::Instr` values (through the `.gtir` parser, so
//! every syntax error is a compile error at the offending tokens) and run at run time through
//! the Tensor API (`gt::frontend::tensor::apply_instr`), so autograd records it. Use it
//! through the facade: `gt::gt!`. The syntax is in `docs/dsl.md`.
//!
//! How it works: `text.rs` writes each statement (tokens up to a `;`) as one line of `.gtir`
//! text, remembering which input tokens every byte came from; `lower.rs` parses the line with
//! `gt_ir::text::parse`, resolves `%names` (earlier statements, else Rust variables),
//! renumbers operands and emits the code; `emit.rs` turns an `Instr` into tokens that build
//! it.

mod emit;
mod lower;
mod text;

use proc_macro::TokenStream;

/// A tensor program in `.gtir` instruction syntax, run through the Tensor API.
///
/// ```ignore
/// fn step(x: &gt::Tensor, w: &gt::Tensor, b: gt::Tensor, lr: f64) -> anyhow::Result<gt::Tensor> {
///     gt::gt! {
///         %h0 = matmul %x, %w;          // `%x`, `%w`, `%b`: Rust variables in scope
///         %h1 = add %h0, %b;
///         %h  = relu %h1;
///         %s  = sum %h axes=[1] keepdim;
///         %y  = mul %s, {lr};           // `{expr}`: a Rust value where a number goes
///         %l, %r = split %h size=2 axis=1;
///     }
///     Ok(y)                             // every value defined is a `gt::Tensor` binding
/// }
/// ```
///
/// - Statements are `.gtir` instructions (`docs/gtir.md`), separated by `;`; comments are
///   Rust's (`//`). Script statements (`print`, `expect`, `repeat`, `signal`, `const`,
///   `free`, `get`, hot-path markers) and `fused` are compile errors.
/// - A `%name` not defined earlier in the macro is the Rust variable `name`, a `Tensor` or a
///   `&Tensor` (anything that is `Borrow<Tensor>`). Each value defined becomes
///   `let name: gt::Tensor`, visible after the macro; defining a name twice is an error.
/// - `{expr}` stands where a number does (a scalar operand, an attribute, a dimension, a
///   slice bound, a data element): the expression is converted with `as` to the field's type
///   (`f64`, `f32`, `i64`, `u64` or `usize`) at run time.
/// - It expands to statements that use `?`: the enclosing function (or closure) returns a
///   `Result` whose error type converts from `gt::TensorError` (`anyhow::Result` does). A
///   statement that gives another number of results than it names (a `split` of a size
///   known only at run time) returns `TensorError::Invalid`.
#[proc_macro]
pub fn gt(input: TokenStream) -> TokenStream {
    lower::expand(input.into()).into()
}

/// Testing aid, not part of the API: every instruction of a `.gtir` text (a raw string
/// literal) as an expression of type `Vec<gt::ir::Instr>` built by the same code generator
/// as `gt!`, so tests can compare it with the parser's instructions for every variant.
#[doc(hidden)]
#[proc_macro]
pub fn gtir_instrs(input: TokenStream) -> TokenStream {
    lower::instrs_of_text(input.into()).into()
}
