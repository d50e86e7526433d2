//! The kernel IR's text form read back: [`parse`] accepts exactly what `Display` for
//! [`Kernel`] writes (`gt-run --dump-kernels`), so `parse(&k.to_string()) == k`.

use super::{Access, Compute, Kernel, MapKernel, MatMulKernel, Node, Precision};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use thiserror::Error;

/// Why kernel text does not parse: the 1-based line and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("kernel text, line {line}: {kind}")]
pub struct ParseKernelError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    #[source]
    pub kind: KernelTextError,
}

/// What is wrong on a line of kernel text. `found` fields quote the text as written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelTextError {
    /// No text at all.
    #[error("empty kernel text")]
    Empty,
    /// A header line not ending in `{`.
    #[error("the header ends with `{{`")]
    HeaderBrace,
    /// A header naming no kind of kernel.
    #[error("expected `kernel map` or `kernel matmul`, found `{found}`")]
    UnknownKind {
        /// The header.
        found: String,
    },
    /// Text after the kernel's closing brace.
    #[error("unexpected `{found}` after the closing `}}`")]
    AfterClose {
        /// The line.
        found: String,
    },
    /// The text ends before the closing brace.
    #[error("missing the closing `}}`")]
    Unclosed,
    /// Something other than the syntax required here.
    #[error("expected {expected}, found `{found}`")]
    Expected {
        /// What the syntax requires (quoted).
        expected: &'static str,
        /// What is there.
        found: String,
    },
    /// A required part that is missing.
    #[error("expected {expected}")]
    Missing {
        /// What the syntax requires (quoted).
        expected: &'static str,
    },
    /// An access offset without its sign.
    #[error("an offset starts with `+`")]
    OffsetSign,
    /// A word that should be a number.
    #[error("`{found}` is not a number")]
    NotANumber {
        /// The word.
        found: String,
    },
    /// Text after an access's strides.
    #[error("unexpected `{found}` after the strides")]
    AfterStrides {
        /// The text.
        found: String,
    },
    /// A node with the wrong number of operands.
    #[error("expected {expected} operands, found {found}")]
    OperandCount {
        /// The node's operands.
        expected: usize,
        /// Operands written.
        found: usize,
    },
    /// A node op that does not exist.
    #[error("unknown node `{op}`")]
    UnknownNode {
        /// The op as written.
        op: String,
    },
    /// A reduction that does not exist.
    #[error("unknown reduction `{op}`")]
    UnknownReduction {
        /// The op as written.
        op: String,
    },
    /// Inputs or nodes numbered out of order.
    #[error("expected {prefix}{expected}, found {found}")]
    Numbering {
        /// `in` or `%`.
        prefix: &'static str,
        /// The next number.
        expected: usize,
        /// The word as written.
        found: String,
    },
    /// A line that is none of the kernel's parts.
    #[error("unexpected `{found}`")]
    Unexpected {
        /// The line or its first word.
        found: String,
    },
}

type Result<T> = std::result::Result<T, KernelTextError>;

fn not_a_number(found: &str) -> KernelTextError {
    KernelTextError::NotANumber { found: found.to_string() }
}

fn missing(expected: &'static str) -> KernelTextError {
    KernelTextError::Missing { expected }
}

/// `[a, b, c]` at the start of `s`; returns the numbers and the rest.
fn list<T: std::str::FromStr>(s: &str) -> Result<(Vec<T>, &str)> {
    let s = s.trim_start();
    let body =
        s.strip_prefix('[').ok_or_else(|| KernelTextError::Expected { expected: "`[`", found: s.to_string() })?;
    let end = body.find(']').ok_or(missing("`]`"))?;
    let items = body[..end]
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().map_err(|_| not_a_number(x)))
        .collect::<Result<Vec<T>>>()?;
    Ok((items, &body[end + 1..]))
}

fn number<T: std::str::FromStr>(s: &str) -> Result<T> {
    s.trim().parse().map_err(|_| not_a_number(s.trim()))
}

/// `+OFFSET strides [..]`.
fn access(s: &str) -> Result<Access> {
    let s = s.trim();
    let (offset, rest) = s.split_once(" strides ").ok_or(missing("`+OFFSET strides [..]`"))?;
    let offset = number(offset.strip_prefix('+').ok_or(KernelTextError::OffsetSign)?)?;
    let (strides, rest) = list(rest)?;
    if !rest.trim().is_empty() {
        return Err(KernelTextError::AfterStrides { found: rest.trim().to_string() });
    }
    Ok(Access { offset, strides })
}

/// `%N` as a node index.
fn node_ref(s: &str) -> Result<u32> {
    number(
        s.trim()
            .strip_prefix('%')
            .ok_or_else(|| KernelTextError::Expected { expected: "`%N`", found: s.trim().to_string() })?,
    )
}

fn refs(s: &str, n: usize) -> Result<Vec<u32>> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() != n {
        return Err(KernelTextError::OperandCount { expected: n, found: parts.len() });
    }
    parts.into_iter().map(node_ref).collect()
}

/// The right-hand side of `%i = ...`.
fn node(s: &str) -> Result<Node> {
    let s = s.trim();
    let (op, args) = s.split_once(' ').unwrap_or((s, ""));
    let seed = |args: &str| number::<u64>(args.trim().strip_prefix("seed=").ok_or(missing("`seed=N`"))?);
    Ok(match op {
        "acc" if args.is_empty() => Node::Acc,
        "load" => Node::Input(number(args.trim().strip_prefix("in").ok_or(missing("`load inN`"))?)?),
        "const" => Node::constant(number(args)?),
        "const64" => Node::Const64(number::<f64>(args)?.to_bits()),
        "iota" => {
            let (start, step) = args.split_once(',').ok_or(missing("`iota START, STEP`"))?;
            Node::Iota { start: number::<f64>(start)?.to_bits(), step: number::<f64>(step)?.to_bits() }
        }
        "rand" => Node::Rand { seed: seed(args)? },
        "round" => {
            let (dtype, rest) = args.trim().split_once(' ').ok_or(missing("`round DTYPE %N`"))?;
            let dtype = crate::DType::from_name(dtype)
                .ok_or_else(|| KernelTextError::Expected { expected: "a dtype", found: dtype.to_string() })?;
            Node::Round(super::Storage::of(dtype), refs(rest, 1)?[0])
        }
        "randn" => Node::Randn { seed: seed(args)? },
        "where" => {
            let r = refs(args, 3)?;
            Node::Select(r[0], r[1], r[2])
        }
        _ => {
            if let Some(red) = op.strip_prefix("row_").and_then(ReduceOp::from_mnemonic) {
                Node::Reduce(red, refs(args, 1)?[0])
            } else if let Some(u) = UnaryOp::from_mnemonic(op) {
                Node::Unary(u, refs(args, 1)?[0])
            } else if let Some(b) = BinaryOp::from_mnemonic(op) {
                let r = refs(args, 2)?;
                Node::Binary(b, r[0], r[1])
            } else {
                return Err(KernelTextError::UnknownNode { op: op.to_string() });
            }
        }
    })
}

/// Parses a kernel's text form.
pub fn parse(text: &str) -> std::result::Result<Kernel, ParseKernelError> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty());
    let fail = |line: usize| move |kind: KernelTextError| ParseKernelError { line, kind };
    let (first, header) = lines.next().ok_or(ParseKernelError { line: 1, kind: KernelTextError::Empty })?;
    let header = header.strip_suffix('{').ok_or_else(|| fail(first)(KernelTextError::HeaderBrace))?.trim();
    let mut kernel = if let Some(rest) = header.strip_prefix("kernel map ") {
        map_header(rest).map_err(fail(first))?
    } else if let Some(rest) = header.strip_prefix("kernel matmul") {
        matmul_header(rest).map_err(fail(first))?
    } else {
        return Err(fail(first)(KernelTextError::UnknownKind { found: header.to_string() }));
    };
    let mut closed = false;
    for (line, l) in lines {
        if closed {
            return Err(fail(line)(KernelTextError::AfterClose { found: l.to_string() }));
        }
        if l == "}" {
            closed = true;
            continue;
        }
        body_line(&mut kernel, l).map_err(fail(line))?;
    }
    if !closed {
        return Err(ParseKernelError { line: text.lines().count().max(1), kind: KernelTextError::Unclosed });
    }
    Ok(kernel)
}

fn map_header(rest: &str) -> Result<Kernel> {
    let (shape, rest) = list::<usize>(rest)?;
    let mut rest = rest.trim();
    let mut compute = Compute::F32;
    if let Some((before, ty)) = rest.rsplit_once(" as ").or_else(|| rest.strip_prefix("as ").map(|t| ("", t))) {
        compute = match crate::DType::from_name(ty.trim()) {
            Some(crate::DType::F32) => Compute::F32,
            Some(crate::DType::F64) => Compute::F64,
            Some(crate::DType::I64) => Compute::I64,
            _ => {
                return Err(KernelTextError::Expected {
                    expected: "`as f32`, `as f64` or `as i64`",
                    found: ty.trim().to_string(),
                })
            }
        };
        rest = before.trim();
    }
    let mut rows = Vec::new();
    if let Some(r) = rest.strip_prefix("rows ") {
        let (axes, r) = list::<usize>(r)?;
        rows = axes;
        rest = r.trim();
    }
    let reduce = match rest {
        "" => None,
        op => {
            Some(ReduceOp::from_mnemonic(op).ok_or_else(|| KernelTextError::UnknownReduction { op: op.to_string() })?)
        }
    };
    let output = Access { offset: 0, strides: vec![] };
    Ok(Kernel::Map(MapKernel { shape, inputs: vec![], nodes: vec![], output, rows, reduce, compute }))
}

fn matmul_header(rest: &str) -> Result<Kernel> {
    let (precision, rest) = match rest.trim().strip_prefix("tf32") {
        Some(r) => (Precision::Tf32, r),
        None => (Precision::F32, rest),
    };
    let rest = rest.trim().strip_prefix("batch ").ok_or(missing("`batch [..]`"))?;
    let (batch, rest) = list::<usize>(rest)?;
    let mut dims = [0usize; 3];
    let words: Vec<&str> = rest.split_whitespace().collect();
    if words.len() != 3 {
        return Err(missing("`m=M n=N k=K`"));
    }
    let names = [("m=", "`m=...`"), ("n=", "`n=...`"), ("k=", "`k=...`")];
    for (slot, (word, (name, expected))) in dims.iter_mut().zip(words.iter().zip(names)) {
        let found = || KernelTextError::Expected { expected, found: word.to_string() };
        *slot = number(word.strip_prefix(name).ok_or_else(found)?)?;
    }
    let [m, n, k] = dims;
    let empty = Access { offset: 0, strides: vec![] };
    Ok(Kernel::MatMul(MatMulKernel {
        batch,
        m,
        n,
        k,
        lhs: empty.clone(),
        rhs: empty,
        epilogue: vec![],
        epilogue_inputs: vec![],
        precision,
    }))
}

fn body_line(kernel: &mut Kernel, l: &str) -> Result<()> {
    let (word, rest) = l.split_once(' ').ok_or_else(|| KernelTextError::Unexpected { found: l.to_string() })?;
    let (inputs, nodes) = match kernel {
        Kernel::Map(k) => (&mut k.inputs, &mut k.nodes),
        Kernel::MatMul(k) => (&mut k.epilogue_inputs, &mut k.epilogue),
    };
    if let Some(i) = word.strip_prefix("in") {
        if number::<usize>(i)? != inputs.len() {
            return Err(KernelTextError::Numbering { prefix: "in", expected: inputs.len(), found: word.to_string() });
        }
        inputs.push(access(rest)?);
    } else if let Some(i) = word.strip_prefix('%') {
        if number::<usize>(i)? != nodes.len() {
            return Err(KernelTextError::Numbering { prefix: "%", expected: nodes.len(), found: word.to_string() });
        }
        nodes.push(node(rest.trim().strip_prefix('=').ok_or(missing("`=`"))?)?);
    } else {
        match (kernel, word) {
            (Kernel::Map(k), "out") => k.output = access(rest)?,
            (Kernel::MatMul(k), "lhs") => k.lhs = access(rest)?,
            (Kernel::MatMul(k), "rhs") => k.rhs = access(rest)?,
            _ => return Err(KernelTextError::Unexpected { found: word.to_string() }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::samples;
    use proptest::prelude::*;

    fn node_strategy(before: u32) -> impl Strategy<Value = Node> {
        let r = 0..before.max(1);
        prop_oneof![
            (0u32..3).prop_map(Node::Input),
            prop_oneof![Just(0.5f32), Just(-1e-5), Just(f32::INFINITY), Just(3.0e38), any::<i16>().prop_map(f32::from)]
                .prop_map(Node::constant),
            prop_oneof![Just(0.1f64), Just(-3.0e300), Just(f64::NEG_INFINITY), any::<i64>().prop_map(|i| i as f64)]
                .prop_map(|x| Node::Const64(x.to_bits())),
            (any::<i32>(), any::<i16>())
                .prop_map(|(a, b)| Node::Iota { start: (f64::from(a) / 7.0).to_bits(), step: f64::from(b).to_bits() }),
            any::<u64>().prop_map(|seed| Node::Rand { seed }),
            any::<u64>().prop_map(|seed| Node::Randn { seed }),
            (0..UnaryOp::ALL.len(), r.clone()).prop_map(|(o, a)| Node::Unary(UnaryOp::ALL[o], a)),
            (0..BinaryOp::ALL.len(), r.clone(), r.clone()).prop_map(|(o, a, b)| Node::Binary(BinaryOp::ALL[o], a, b)),
            (r.clone(), r.clone(), r.clone()).prop_map(|(c, t, f)| Node::Select(c, t, f)),
            r.clone().prop_map(|a| Node::Round(super::super::Storage::F16, a)),
            (0..ReduceOp::ALL.len(), r).prop_map(|(o, a)| Node::Reduce(ReduceOp::ALL[o], a)),
            Just(Node::Acc),
        ]
    }

    fn access_strategy(rank: usize) -> impl Strategy<Value = Access> {
        (any::<i32>(), prop::collection::vec(any::<i32>(), rank))
            .prop_map(|(o, s)| Access { offset: o.into(), strides: s.into_iter().map(i64::from).collect() })
    }

    proptest! {
        /// Printing then parsing gives the same kernel (validity is not required).
        #[test]
        fn map_kernels_round_trip(
            shape in prop::collection::vec(0usize..100, 0..4),
            nodes in prop::collection::vec(node_strategy(6), 1..8),
            inputs in prop::collection::vec(access_strategy(3), 0..3),
            output in access_strategy(3),
            rows in prop::collection::vec(0usize..4, 0..3),
            reduce in prop::option::of(0..ReduceOp::ALL.len()),
            compute in prop_oneof![Just(Compute::F32), Just(Compute::F64), Just(Compute::I64)],
        ) {
            let k = Kernel::Map(MapKernel { shape, inputs, nodes, output, rows, reduce: reduce.map(|r| ReduceOp::ALL[r]), compute });
            prop_assert_eq!(parse(&k.to_string()), Ok(k));
        }

        #[test]
        fn matmul_kernels_round_trip(
            batch in prop::collection::vec(0usize..5, 0..3),
            mnk in (0usize..999, 0usize..999, 0usize..999),
            lhs in access_strategy(4),
            rhs in access_strategy(4),
            epilogue in prop::collection::vec(node_strategy(4), 0..5),
            epilogue_inputs in prop::collection::vec(access_strategy(4), 0..3),
            tf32 in any::<bool>(),
        ) {
            let precision = if tf32 { Precision::Tf32 } else { Precision::F32 };
            let (m, n, k) = mnk;
            let kernel = Kernel::MatMul(MatMulKernel { batch, m, n, k, lhs, rhs, epilogue, epilogue_inputs, precision });
            prop_assert_eq!(parse(&kernel.to_string()), Ok(kernel));
        }

        /// Arbitrary text never panics the parser.
        #[test]
        fn garbage_is_an_error_not_a_panic(text in "\\PC*") {
            let _ = parse(&text);
        }
    }

    #[test]
    fn samples_round_trip_and_errors_name_the_line() {
        for k in [samples::softmax(&[4, 8]), samples::layer_norm(&[3, 5], 1e-5), samples::linear_relu(2, 3, 4)] {
            assert_eq!(parse(&k.to_string()), Ok(k));
        }
        let bad = "kernel map [4] {\n  in0 +0 strides [1]\n  %0 = load in0\n  %1 = frobnicate %0\n}";
        let e = parse(bad).unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        assert!(e.to_string().contains("unknown node `frobnicate`"), "{e}");
        assert_eq!(e.kind, KernelTextError::UnknownNode { op: "frobnicate".into() });
        let e = parse("kernel map [4] {\n  %0 = acc\n").unwrap_err();
        assert_eq!(e.kind, KernelTextError::Unclosed);
        assert!(e.to_string().contains("closing"));
        let e = parse("kernel fft [4] {\n}").unwrap_err();
        assert!(matches!(e.kind, KernelTextError::UnknownKind { .. }));
        assert!(e.to_string().contains("kernel map"));
    }
}
