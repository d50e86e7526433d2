//! gt-ir: the language of gt. Types, the one `Instr` enum, programs, the `.gtir` text
//! format (printer and parser with exact round trip) and the verifier; also the
//! counter-based RNG ([`random`]) that every backend reproduces. No I/O, no threads.
//!
//! # Semantics
//!
//! A *stream* is a sequence of [`Instr`]s. Each instruction defines its results (SSA
//! [`ValueId`]s, each defined once) from values defined earlier. Values are tensors: a
//! [`TensorType`] (dtype and shape) plus row-major data that lives wherever the runtime
//! put it. Instructions are conceptually executed in order; a runtime may run them
//! asynchronously, in batches, fused or sharded, as long as every value read by the client
//! at a sync point ([`Instr::GetData`]) equals the value the reference interpreter
//! (`gt-runtime`'s `cpu::interp`) computes, within tolerance.
//!
//! - Elementwise binary ops, `where` and matmul's batch dimensions broadcast like NumPy:
//!   shapes align from the right; each pair of sizes must be equal or one of them 1.
//! - Comparisons give 1.0 where true, 0.0 where false, in the operands' dtype.
//! - Axes may be negative (counting from the end) wherever an axis is taken.
//! - `free` ends a value's life; reading it afterwards is an error.
//!
//! A [`Program`] (a `.gtir` file) adds script statements around instructions: `const`,
//! `print`, `expect`, `repeat N { }` and `signal "name" { }`. See `docs/gtir.md` for the
//! grammar.
//!
//! # Invariants
//! - `text::parse(&text::print(p)) == p` for every program `p` (spans aside).
//! - [`verify::shape::infer`] is the only place type rules live; backends call it too.

pub mod cost;
pub mod data;
pub mod entity;
pub mod exec;
pub mod formula;
pub mod instr;
pub mod kernel;
pub mod math64;
pub mod ops;
pub mod program;
pub mod random;
pub mod span;
pub mod structure;
pub mod text;
pub mod types;
pub mod verify;

pub use data::HostTensor;
pub use entity::ValueId;
pub use exec::{Executor, FailureKind};
pub use instr::{CollectiveOp, Instr, InstrValues, Operand, Placement, SliceItem, SplitSpec};
pub use ops::{BinaryOp, BinaryPrim, OpDef, ReduceOp, UnaryOp, UnaryPrim};
pub use program::{Comparison, Number, Optimizer, Program, Stmt, StmtKind, Train};
pub use span::Span;
pub use types::{DType, Shape, TensorType};
pub use verify::{shape::TypeError, verify, Types, VerifyError, VerifyErrorKind, VerifyErrors};

/// `a == b`, without calling `memcmp` when both are empty. Comparing slices of plain data
/// calls `memcmp` even for no bytes, and glibc's AVX-512 `memcmp` then makes a masked load
/// (mask zero) through an empty `Vec`'s dangling pointer (`0x4`, `0x8`), in the unmapped
/// first page, whose fault the CPU must suppress: measured at about 140 ns a call on the
/// 2-core AMD EPYC VM, against 1 ns for two empty slices of a real buffer. Kernels and
/// metas compared on every step hold such vectors (a plain map's `rows`, a product's
/// `batch`, a home placement).
#[inline]
pub fn same_elements<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}
