//! What one instruction costs: floating-point operations and bytes moved, from its types
//! alone, as profiles report them (`gt prof`). Conventions (those of PyTorch's FLOP counter
//! and most profilers): a matmul `[.., m, k] @ [.., k, n]` is `2·m·n·k` per matrix; every
//! elementwise op (a transcendental included) and every element a reduction takes in is one;
//! creation ops, views, copies, collectives and markers are none. Bytes read are what the
//! operands hold, bytes written what the results hold.

use crate::instr::Instr;
use crate::kernel::{Kernel, Node};
use crate::types::TensorType;

/// The cost of one instruction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Floating-point operations.
    pub flops: u64,
    /// Bytes its operands hold.
    pub bytes_read: u64,
    /// Bytes its results hold.
    pub bytes_written: u64,
}

/// The cost of `instr` with operands of types `operands` (in [`Instr::operands`] order) and
/// results of types `results`. Saturating: absurd sizes give `u64::MAX`, never a panic.
pub fn cost(instr: &Instr, operands: &[TensorType], results: &[TensorType]) -> Cost {
    let bytes = |types: &[TensorType]| types.iter().fold(0u64, |n, t| n.saturating_add(t.size_bytes() as u64));
    let numel = |t: Option<&TensorType>| t.map_or(0, |t| t.shape.numel() as u64);
    let out = numel(results.first());
    let flops = match instr {
        Instr::MatMul { .. } => {
            // `k` is the left operand's last axis (a 1-d operand is promoted, as in NumPy).
            let k = operands.first().and_then(|t| t.shape.dims().last().copied()).unwrap_or(0) as u64;
            out.saturating_mul(k).saturating_mul(2)
        }
        Instr::Unary { .. } | Instr::Binary { .. } | Instr::Where { .. } => out,
        Instr::Reduce { .. } => numel(operands.first()),
        Instr::Fused { kernel, .. } => kernel_flops(kernel),
        _ => 0,
    };
    Cost { flops, bytes_read: bytes(operands), bytes_written: bytes(results) }
}

/// The operations of a compiled kernel: each arithmetic node once per element of its
/// iteration space, a final row reduction once per element, a matmul's products.
pub fn kernel_flops(kernel: &Kernel) -> u64 {
    let ops = |nodes: &[Node]| {
        nodes
            .iter()
            .filter(|n| matches!(n, Node::Unary(..) | Node::Binary(..) | Node::Select(..) | Node::Reduce(..)))
            .count() as u64
    };
    match kernel {
        Kernel::Map(m) => {
            let numel = m.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
            let per_element = ops(&m.nodes) + u64::from(m.reduce.is_some());
            numel.saturating_mul(per_element)
        }
        Kernel::MatMul(k) => {
            let outputs = (k.batch_count() as u64).saturating_mul(k.m as u64).saturating_mul(k.n as u64);
            let products = outputs.saturating_mul(k.k as u64).saturating_mul(2);
            products.saturating_add(outputs.saturating_mul(ops(&k.epilogue)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;
    use crate::types::DType;
    use crate::verify::shape::infer;
    use crate::{Program, StmtKind, ValueId};
    use foldhash::{HashMap, HashMapExt};

    /// The cost of each instruction of a program, typed as the verifier types it.
    fn costs(text: &str) -> Vec<(String, Cost)> {
        let program: Program = parse(text).unwrap();
        let mut types: HashMap<ValueId, TensorType> = HashMap::new();
        let mut out = Vec::new();
        for stmt in &program.body {
            let StmtKind::Instr(i) = &stmt.kind else { continue };
            let results =
                infer(i, &|v| types.get(&v).cloned().ok_or(crate::verify::TypeError::UnknownValue(v))).unwrap();
            let operands: Vec<TensorType> = i.operands().iter().map(|v| types[v].clone()).collect();
            out.push((i.mnemonic().to_string(), cost(i, &operands, &results)));
            for (v, t) in i.results().into_iter().zip(results) {
                types.insert(v, t);
            }
        }
        out
    }

    fn f32s(n: u64) -> u64 {
        n * DType::F32.size_bytes() as u64
    }

    #[test]
    fn matmul_is_two_m_n_k() {
        let c = costs("%a = zeros f32[64, 784]\n%w = zeros f32[784, 256]\n%y = matmul %a, %w\n");
        let (_, mm) = &c[2];
        assert_eq!(mm.flops, 2 * 64 * 256 * 784);
        assert_eq!(mm.bytes_read, f32s(64 * 784 + 784 * 256));
        assert_eq!(mm.bytes_written, f32s(64 * 256));
        // Batched, with a broadcast right operand: every matrix of the batch counts.
        let c = costs("%a = zeros f32[3, 4, 5]\n%w = zeros f32[5, 6]\n%y = matmul %a, %w\n");
        assert_eq!(c[2].1.flops, 2 * 3 * 4 * 6 * 5);
    }

    #[test]
    fn elementwise_is_one_per_result_element_and_reduction_one_per_input_element() {
        let c = costs("%a = zeros f32[10, 20]\n%b = exp %a\n%c = add %a, %b\n%s = sum %c axes=[1]\n");
        assert_eq!(c[0].1.flops, 0, "creation computes nothing");
        assert_eq!(c[0].1.bytes_read, 0);
        assert_eq!(c[1].1, Cost { flops: 200, bytes_read: f32s(200), bytes_written: f32s(200) });
        assert_eq!(c[2].1, Cost { flops: 200, bytes_read: f32s(400), bytes_written: f32s(200) });
        assert_eq!(c[3].1, Cost { flops: 200, bytes_read: f32s(200), bytes_written: f32s(10) });
    }

    #[test]
    fn fused_kernels_count_their_nodes() {
        let softmax = crate::kernel::samples::softmax(&[4, 8]);
        let Kernel::Map(m) = &softmax else { panic!("softmax is a map") };
        // Per element: max (reduce), sub, exp, sum (reduce), div: at least these five compute.
        let per =
            m.nodes.iter().filter(|n| !matches!(n, Node::Input(_) | Node::Const(_) | Node::Const64(_))).count() as u64;
        assert!(per >= 5, "{m:?}");
        assert_eq!(kernel_flops(&softmax), 32 * (per + u64::from(m.reduce.is_some())));
    }

    #[test]
    fn absurd_sizes_saturate() {
        let huge = TensorType::new(DType::F32, vec![usize::MAX, 4]);
        let instr = parse("%a = zeros f32[2]\n%b = exp %a\n").unwrap();
        let StmtKind::Instr(i) = &instr.body[1].kind else { unreachable!() };
        let c = cost(i, std::slice::from_ref(&huge), std::slice::from_ref(&huge));
        assert_eq!(c.bytes_read, u64::MAX);
    }
}
