//! A program over every dtype (shared by the `it` and `cuda` test crates through `#[path]`):
//! each op family in `f64`, `i64`, `i32` and `bool` (kernels computing in `f64` or `i64`),
//! every cast, over values at the edges (past 2^53, wrapping, -0.0, a subnormal, NaN), and
//! long rows that reduce in two passes.

use gt_ir::data::Elements;
use gt_ir::{BinaryOp, DType, Instr, Operand, ReduceOp, TensorType, UnaryOp, ValueId};

/// The instructions whose every result is compared exactly (`f64`'s transcendental
/// functions too: `gt_ir::math64`'s, which the CPU and the GPU compute alike), and those
/// compared within 1e-12 (`f64` sums of a long row, added in another order; `pow` of `f64`,
/// libm's on the CPU and `exp(b ln a)` on the GPU; `softplus`, a composite).
pub fn dtype_program() -> (Vec<Instr>, Vec<Instr>) {
    let v = ValueId;
    let n = 6;
    let lit =
        |dst: u32, data: Elements| Instr::Literal { dst: v(dst), ty: TensorType::new(data.dtype(), vec![n]), data };
    let mut instrs = vec![
        lit(0, Elements::from(vec![1.5f64, -0.0, 1e300, 5e-324, f64::NAN, -7.25])),
        lit(1, Elements::from(vec![0.1f64, 2.0, -1e300, 1.0, 3.0, -7.25])),
        lit(2, Elements::from(vec![9_007_199_254_740_993i64, -5, i64::MAX, i64::MIN, 0, 1 << 40])),
        lit(3, Elements::from(vec![3i64, -5, 2, -1, 7, 1 << 30])),
        lit(4, Elements::from(vec![i32::MAX, i32::MIN, 46_341, -1, 0, 65_536])),
        lit(5, Elements::from(vec![true, false, true, false, false, true])),
    ];
    let mut next = 10u32;
    let mut push = |instrs: &mut Vec<Instr>, make: &dyn Fn(ValueId) -> Instr| {
        instrs.push(make(v(next)));
        next += 1;
    };
    let val = |i: u32| Operand::Value(v(i));
    for (a, b) in [(0u32, 1u32), (2, 3), (4, 4), (2, 4), (5, 5), (0, 2)] {
        // `bool`s only compare; `pow` is compared within a tolerance (below).
        let takes = |op: &BinaryOp| *op != BinaryOp::Pow && (a != 5 || op.is_comparison());
        for op in BinaryOp::ALL.iter().copied().filter(takes) {
            push(&mut instrs, &|dst| Instr::Binary { dst, op, lhs: val(a), rhs: val(b) });
        }
        if a != 5 {
            push(&mut instrs, &|dst| Instr::Binary { dst, op: BinaryOp::Mul, lhs: val(a), rhs: Operand::Scalar(3.0) });
        }
    }
    for src in [0u32, 2, 3, 4] {
        for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu] {
            push(&mut instrs, &|dst| Instr::Unary { dst, op, src: v(src) });
        }
    }
    push(&mut instrs, &|dst| Instr::Unary { dst, op: UnaryOp::Sqrt, src: v(1) });
    for src in [0u32, 2, 4, 5] {
        for op in ReduceOp::ALL.iter().copied().filter(|op| *op != ReduceOp::Mean || src == 0) {
            push(&mut instrs, &|dst| Instr::Reduce { dst, op, src: v(src), axes: None, keepdim: false });
        }
        for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::Bool] {
            push(&mut instrs, &|dst| Instr::Cast { dst, src: v(src), dtype });
        }
        push(&mut instrs, &|dst| Instr::Where { dst, cond: v(5), on_true: val(src), on_false: val(3) });
    }
    // Long rows: two passes, partials in i64 and f64.
    let end = -5000.0 + 3.0 * f64::from(1 << 17);
    instrs.push(Instr::Arange { dst: v(200), dtype: DType::I64, start: -5000.0, end, step: 3.0 });
    instrs.push(Instr::Binary { dst: v(201), op: BinaryOp::Mul, lhs: val(200), rhs: val(200) });
    instrs.push(Instr::Cast { dst: v(202), src: v(201), dtype: DType::F64 });
    for (dst, op) in [(203, ReduceOp::Sum), (204, ReduceOp::Max)] {
        instrs.push(Instr::Reduce { dst: v(dst), op, src: v(201), axes: None, keepdim: false });
    }
    let mut close = vec![
        Instr::Reduce { dst: v(205), op: ReduceOp::Mean, src: v(202), axes: None, keepdim: false },
        Instr::Reduce { dst: v(206), op: ReduceOp::Sum, src: v(202), axes: Some(vec![0]), keepdim: true },
    ];
    let mut dst = 210;
    for src in [0u32, 1] {
        for op in [UnaryOp::Exp, UnaryOp::Log, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Erf] {
            instrs.push(Instr::Unary { dst: v(dst), op, src: v(src) });
            dst += 1;
        }
        close.push(Instr::Unary { dst: v(dst), op: UnaryOp::Softplus, src: v(src) });
        dst += 1;
    }
    close.push(Instr::Binary { dst: v(dst), op: BinaryOp::Pow, lhs: val(1), rhs: Operand::Scalar(3.0) });
    close.push(Instr::Binary { dst: v(dst + 1), op: BinaryOp::Pow, lhs: val(1), rhs: val(0) });
    (instrs, close)
}
