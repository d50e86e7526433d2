//! The `.gtir` parser: recursive descent over tokens into a [`Program`]. Names are
//! resolved to dense [`ValueId`]s and constants to numbers here; every semantic check
//! (definitions, types) is the verifier's.

use super::lexer::{lex, Tok};
use super::{OperandCount, ParseError, ParseErrorKind};
use crate::data::Elements;
use crate::{
    BinaryOp, CollectiveOp, Comparison, DType, Instr, Number, Operand, Optimizer, Placement, Program, ReduceOp, Shape,
    SliceItem, Span, SplitSpec, Stmt, StmtKind, TensorType, Train, UnaryOp, ValueId,
};
use foldhash::{HashMap, HashMapExt};

/// Deepest nesting of `repeat`/`signal` blocks and bracketed lists.
pub const MAX_NESTING: usize = 64;

/// Parses a program from bytes, rejecting input that is not UTF-8 with the offset of the
/// first bad byte.
pub fn parse_bytes(bytes: &[u8]) -> Result<Program, ParseError> {
    match std::str::from_utf8(bytes) {
        Ok(src) => parse(src),
        Err(e) => {
            let at = e.valid_up_to();
            Err(ParseError { span: Span::new(at, at + 1), kind: ParseErrorKind::NotUtf8 { offset: at } })
        }
    }
}

/// Parses a program from text.
pub fn parse(src: &str) -> Result<Program, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser { toks, pos: 0, names: Vec::new(), ids: HashMap::new(), consts: HashMap::new(), depth: 0 };
    let body = p.block(true)?;
    Ok(Program { body, names: p.names })
}

/// Every op mnemonic the parser knows, for suggestions.
pub fn mnemonics() -> Vec<&'static str> {
    let mut v = vec![
        "randn",
        "rand",
        "zeros",
        "ones",
        "full",
        "arange",
        "tensor",
        "cast",
        "where",
        "matmul",
        "transpose",
        "permute",
        "reshape",
        "squeeze",
        "unsqueeze",
        "broadcast_to",
        "concat",
        "slice",
        "split",
        "chunk",
        "fused",
    ];
    v.extend(CollectiveOp::MNEMONICS);
    v.extend(UnaryOp::ALL.iter().map(|o| o.mnemonic()));
    v.extend(BinaryOp::ALL.iter().map(|o| o.mnemonic()));
    v.extend(ReduceOp::ALL.iter().map(|o| o.mnemonic()));
    v
}

/// The closest candidate to a misspelt word, if any is close.
pub(crate) fn suggest(word: &str, candidates: impl IntoIterator<Item = impl AsRef<str>>) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c.as_ref()), c.as_ref().to_string()))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) && *d < c.len())
        .min()
        .map(|(_, c)| c)
}

struct Parser {
    toks: Vec<(Tok, Span)>,
    pos: usize,
    names: Vec<String>,
    ids: HashMap<String, ValueId>,
    consts: HashMap<String, Number>,
    depth: usize,
}

/// An attribute as written: `name=value` or a bare flag.
struct Attr {
    name: String,
    span: Span,
    value: AttrValue,
}

enum AttrValue {
    Flag,
    Number(Number),
    List(Vec<(Number, Span)>),
}

type PResult<T> = Result<T, ParseError>;

fn err<T>(span: Span, kind: ParseErrorKind) -> PResult<T> {
    Err(ParseError { span, kind })
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn peek_at(&self, n: usize) -> &Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].0
    }

    fn span(&self) -> Span {
        self.toks[self.pos].1
    }

    fn prev_span(&self) -> Span {
        self.toks[self.pos.saturating_sub(1)].1
    }

    fn bump(&mut self) -> (Tok, Span) {
        let t = self.toks[self.pos].clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == t {
            self.bump();
            true
        } else {
            false
        }
    }

    fn expected<T>(&self, what: &'static str) -> PResult<T> {
        err(self.span(), ParseErrorKind::Expected { expected: what, found: self.peek().describe() })
    }

    fn expect(&mut self, t: Tok, what: &'static str) -> PResult<Span> {
        if self.peek() == &t {
            Ok(self.bump().1)
        } else {
            self.expected(what)
        }
    }

    fn skip_newlines(&mut self) {
        while self.eat(&Tok::Newline) {}
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return err(self.span(), ParseErrorKind::NestingTooDeep { limit: MAX_NESTING });
        }
        Ok(())
    }

    /// Statements up to `}` (inner blocks) or end of file (the top level).
    fn block(&mut self, top: bool) -> PResult<Vec<Stmt>> {
        let mut body = Vec::new();
        loop {
            self.skip_newlines();
            match self.peek() {
                Tok::Eof if top => return Ok(body),
                Tok::Eof => return self.expected("`}` to close the block"),
                Tok::RBrace if top => return err(self.span(), ParseErrorKind::UnmatchedBrace),
                Tok::RBrace => return Ok(body),
                _ => {}
            }
            let start = self.span();
            let kind = self.stmt()?;
            let span = start.to(self.prev_span());
            match self.peek() {
                Tok::Newline | Tok::Eof | Tok::RBrace => {}
                _ => return self.expected("end of line after the statement"),
            }
            body.push(Stmt { kind, span });
        }
    }

    fn stmt(&mut self) -> PResult<StmtKind> {
        match self.peek().clone() {
            Tok::Value(_) => self.definition(),
            Tok::Ident(word) => {
                let span = self.span();
                match word.as_str() {
                    "const" => {
                        self.bump();
                        self.constant()
                    }
                    "free" | "get" | "print" => {
                        self.bump();
                        let src = self.value_use()?;
                        Ok(match word.as_str() {
                            "free" => StmtKind::Instr(Instr::Free { src }),
                            "get" => StmtKind::Instr(Instr::GetData { src }),
                            _ => StmtKind::Print { src },
                        })
                    }
                    "expect" => {
                        self.bump();
                        self.expectation()
                    }
                    "hotpath_start" | "hotpath_end" => {
                        self.bump();
                        let id = self.uint("a hot-path id")?;
                        Ok(StmtKind::Instr(if word == "hotpath_start" {
                            Instr::HotPathStart { id }
                        } else {
                            Instr::HotPathEnd { id }
                        }))
                    }
                    "requires_grad" | "zero_grad" | "sgd" | "adam" => {
                        self.bump();
                        let mut values = vec![self.value_use()?];
                        while self.eat(&Tok::Comma) {
                            values.push(self.value_use()?);
                        }
                        let mut a = Attrs::new(&word, self.attrs()?, self.prev_span());
                        let train = match word.as_str() {
                            "requires_grad" => Train::RequiresGrad { values },
                            "zero_grad" => Train::ZeroGrad { values },
                            "sgd" => Train::Step {
                                optimizer: Optimizer::Sgd {
                                    lr: a.required_float("lr")?,
                                    momentum: a.float_or("momentum", 0.0)?,
                                    weight_decay: a.float_or("weight_decay", 0.0)?,
                                },
                                params: values,
                            },
                            _ => Train::Step {
                                optimizer: Optimizer::Adam {
                                    lr: a.float_or("lr", 1e-3)?,
                                    beta1: a.float_or("beta1", 0.9)?,
                                    beta2: a.float_or("beta2", 0.999)?,
                                    eps: a.float_or("eps", 1e-8)?,
                                },
                                params: values,
                            },
                        };
                        a.finish()?;
                        Ok(StmtKind::Train(train))
                    }
                    "backward" => {
                        self.bump();
                        Ok(StmtKind::Train(Train::Backward { loss: self.value_use()? }))
                    }
                    "signal_start" | "signal_end" => {
                        self.bump();
                        let name = self.signal_name()?;
                        Ok(StmtKind::Instr(if word == "signal_start" {
                            let mut flag = |word: &str| {
                                let found = matches!(self.peek(), Tok::Ident(w) if w == word);
                                if found {
                                    self.bump();
                                }
                                found
                            };
                            let backward = flag("backward");
                            let compile = flag("compile");
                            let place = self.placement()?;
                            Instr::SignalStart { name, compile, backward, place }
                        } else {
                            Instr::SignalEnd { name }
                        }))
                    }
                    "repeat" => {
                        self.bump();
                        let count = self.uint("a repeat count")?;
                        let body = self.braced()?;
                        Ok(StmtKind::Repeat { count, body })
                    }
                    "signal" => {
                        self.bump();
                        let name = self.signal_name()?;
                        let body = self.braced()?;
                        Ok(StmtKind::Signal { name, body })
                    }
                    _ if is_op(&word) => err(span, ParseErrorKind::MissingResult { op: word.clone() }),
                    _ => {
                        let mut keywords = vec![
                            "const",
                            "free",
                            "get",
                            "print",
                            "expect",
                            "repeat",
                            "signal",
                            "hotpath_start",
                            "hotpath_end",
                            "signal_start",
                            "signal_end",
                            "requires_grad",
                            "backward",
                            "zero_grad",
                            "sgd",
                            "adam",
                        ];
                        keywords.extend(mnemonics());
                        err(span, ParseErrorKind::UnknownStatement { suggestion: suggest(&word, keywords), word })
                    }
                }
            }
            _ => {
                self.expected("a statement (`%name = op ...`, `print`, `expect`, `free`, `repeat`, `signal`, `const`)")
            }
        }
    }

    fn signal_name(&mut self) -> PResult<String> {
        match self.bump() {
            (Tok::Str(s), _) => Ok(s),
            (t, span) => {
                err(span, ParseErrorKind::Expected { expected: "a signal name in quotes", found: t.describe() })
            }
        }
    }

    fn braced(&mut self) -> PResult<Vec<Stmt>> {
        self.expect(Tok::LBrace, "`{`")?;
        self.enter()?;
        let body = self.block(false)?;
        self.expect(Tok::RBrace, "`}`")?;
        self.depth -= 1;
        Ok(body)
    }

    fn constant(&mut self) -> PResult<StmtKind> {
        let (name, span) = match self.bump() {
            (Tok::Ident(n), s) => (n, s),
            (t, s) => return err(s, ParseErrorKind::Expected { expected: "a constant name", found: t.describe() }),
        };
        if self.consts.contains_key(&name) {
            return err(span, ParseErrorKind::DuplicateConst { name });
        }
        self.expect(Tok::Eq, "`=`")?;
        let (value, _) = self.number()?;
        self.consts.insert(name.clone(), value);
        Ok(StmtKind::Const { name, value })
    }

    fn value_id(&mut self, name: &str) -> ValueId {
        if let Some(&v) = self.ids.get(name) {
            return v;
        }
        let v = ValueId(self.names.len() as u32);
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), v);
        v
    }

    fn value_use(&mut self) -> PResult<ValueId> {
        match self.bump() {
            (Tok::Value(n), _) => Ok(self.value_id(&n)),
            (t, s) => err(s, ParseErrorKind::Expected { expected: "a value like `%x`", found: t.describe() }),
        }
    }

    fn definition(&mut self) -> PResult<StmtKind> {
        let mut dsts = vec![self.value_use()?];
        while self.eat(&Tok::Comma) {
            dsts.push(self.value_use()?);
        }
        self.expect(Tok::Eq, "`=` after the result names")?;
        let (op, op_span) = match self.bump() {
            (Tok::Ident(n), s) => (n, s),
            (t, s) => return err(s, ParseErrorKind::Expected { expected: "an op name", found: t.describe() }),
        };
        if op == "grad" {
            let dst = self.single(&op, op_span, &dsts)?;
            return Ok(StmtKind::Train(Train::Grad { dst, of: self.value_use()? }));
        }
        let instr = self.op(&op, op_span, &dsts)?;
        Ok(StmtKind::Instr(instr))
    }

    /// A signal marker's placement: `shard [axis=N] [workers=[..]]`, `replicated
    /// [workers=[..]]`, or nothing.
    fn placement(&mut self) -> PResult<Option<Placement>> {
        let (kind, span) = match self.peek() {
            Tok::Ident(w) if w == "shard" || w == "replicated" => {
                let kind = w.clone();
                (kind, self.bump().1)
            }
            _ => return Ok(None),
        };
        let mut a = Attrs::new(&kind, self.attrs()?, span);
        let workers = a.uint_list("workers")?.unwrap_or_default();
        let workers = workers
            .into_iter()
            .map(|w| {
                u32::try_from(w).map_err(|_| ParseError {
                    span,
                    kind: ParseErrorKind::Expected { expected: "a worker index below 2^32", found: w.to_string() },
                })
            })
            .collect::<PResult<Vec<u32>>>()?;
        let place = if kind == "shard" {
            Placement::Split { axis: a.int_or("axis", 0)?, workers }
        } else {
            Placement::Replicated { workers }
        };
        a.finish()?;
        Ok(Some(place))
    }

    /// `all_reduce sum %a, %b`, `all_gather %a, %b axis=0`, `reduce_scatter sum %a, %b axis=0`,
    /// `broadcast %a`, `move %a`.
    fn collective(&mut self, op: &str, op_span: Span, dsts: &[ValueId]) -> PResult<Instr> {
        let reduction = if matches!(op, "all_reduce" | "reduce_scatter") {
            match self.bump() {
                (Tok::Ident(w), s) => match ReduceOp::from_mnemonic(&w) {
                    Some(r) => Some(r),
                    None => {
                        return err(
                            s,
                            ParseErrorKind::Expected {
                                expected: "a reduction (`sum`, `mean`, `max`, `min`)",
                                found: format!("`{w}`"),
                            },
                        )
                    }
                },
                (t, s) => {
                    return err(
                        s,
                        ParseErrorKind::Expected {
                            expected: "a reduction (`sum`, `mean`, `max`, `min`)",
                            found: t.describe(),
                        },
                    )
                }
            }
        } else {
            None
        };
        let (operands, ospan) = self.operands()?;
        let count = if matches!(op, "broadcast" | "move") { 1 } else { operands.len().max(1) };
        let srcs = self.operand_values(op, &operands, ospan, count)?;
        let mut a = Attrs::new(op, self.attrs()?, op_span);
        let op = match (op, reduction) {
            ("all_reduce", Some(r)) => CollectiveOp::AllReduce(r),
            ("all_gather", _) => CollectiveOp::AllGather { axis: a.int_or("axis", 0)? },
            ("reduce_scatter", Some(r)) => CollectiveOp::ReduceScatter { op: r, axis: a.int_or("axis", 0)? },
            ("broadcast", _) => CollectiveOp::Broadcast,
            _ => CollectiveOp::Move,
        };
        a.finish()?;
        Ok(Instr::Collective { dsts: dsts.to_vec(), op, srcs })
    }

    fn single(&self, op: &str, span: Span, dsts: &[ValueId]) -> PResult<ValueId> {
        if dsts.len() != 1 {
            return err(span, ParseErrorKind::ResultCount { op: op.to_string(), found: dsts.len() });
        }
        Ok(dsts[0])
    }

    fn op(&mut self, op: &str, op_span: Span, dsts: &[ValueId]) -> PResult<Instr> {
        if !is_op(op) {
            return err(
                op_span,
                ParseErrorKind::UnknownOp { name: op.to_string(), suggestion: suggest(op, mnemonics()) },
            );
        }
        if matches!(op, "split" | "chunk") {
            let (operands, ospan) = self.operands()?;
            let src = self.operand_values(op, &operands, ospan, 1)?[0];
            let attrs = self.attrs()?;
            let mut a = Attrs::new(op, attrs, op_span);
            let axis = a.int_or("axis", 0)?;
            let spec = if op == "chunk" {
                SplitSpec::Chunks(a.required_uint("chunks")? as usize)
            } else if a.has("sizes") {
                a.allow_only_one_of("size", "sizes")?;
                SplitSpec::Sizes(a.uint_list("sizes")?.unwrap_or_default())
            } else {
                SplitSpec::Size(a.required_uint("size")? as usize)
            };
            a.finish()?;
            return Ok(Instr::Split { dsts: dsts.to_vec(), src, axis, spec });
        }
        if CollectiveOp::MNEMONICS.contains(&op) {
            return self.collective(op, op_span, dsts);
        }
        let dst = self.single(op, op_span, dsts)?;
        // Creation ops take a type first.
        match op {
            "randn" | "rand" | "zeros" | "ones" | "full" | "tensor" => {
                let ty = self.tensor_type()?;
                let instr = match op {
                    "full" => {
                        let (n, span) = self.number()?;
                        Instr::Full { dst, ty, value: exact_scalar(n, span)? }
                    }
                    "tensor" => {
                        let data = self.elements(ty.dtype)?;
                        Instr::Literal { dst, ty, data }
                    }
                    _ => {
                        let mut a = Attrs::new(op, self.attrs()?, op_span);
                        let instr = match op {
                            "randn" => Instr::Randn { dst, ty, seed: a.uint_or("seed", 0)? },
                            "rand" => Instr::Rand { dst, ty, seed: a.uint_or("seed", 0)? },
                            "zeros" => Instr::Zeros { dst, ty },
                            _ => Instr::Ones { dst, ty },
                        };
                        a.finish()?;
                        return Ok(instr);
                    }
                };
                Attrs::new(op, self.attrs()?, op_span).finish()?;
                return Ok(instr);
            }
            "fused" => {
                let (operands, ospan) = self.operands()?;
                let srcs = self.operand_values(op, &operands, ospan, operands.len())?;
                self.expect(Tok::Colon, "`:` and the result type after the operands")?;
                let ty = self.tensor_type()?;
                let kernel = match self.bump() {
                    (Tok::Kernel(text), span) => crate::kernel::text::parse(&text).map_err(|e| {
                        // Point at the kernel line that is wrong.
                        let skip: usize = text.split_inclusive('\n').take(e.line - 1).map(str::len).sum();
                        let len = text[skip..].find('\n').unwrap_or(text.len() - skip);
                        let at = span.start as usize + skip;
                        ParseError { span: Span::new(at, at + len), kind: ParseErrorKind::Kernel { source: e.kind } }
                    })?,
                    (t, s) => {
                        return err(s, ParseErrorKind::Expected { expected: "`kernel ...`", found: t.describe() })
                    }
                };
                Attrs::new(op, self.attrs()?, op_span).finish()?;
                return Ok(Instr::Fused { dst, ty, srcs, kernel: Box::new(kernel) });
            }
            "arange" => {
                let dtype = self.dtype()?;
                let mut a = Attrs::new(op, self.attrs()?, op_span);
                let start = a.float_or("start", 0.0)?;
                let end = a.required_float("end")?;
                let step = a.float_or("step", 1.0)?;
                a.finish()?;
                return Ok(Instr::Arange { dst, dtype, start, end, step });
            }
            _ => {}
        }
        let (operands, ospan) = self.operands()?;
        let instr = if let Some(uop) = UnaryOp::from_mnemonic(op) {
            let src = self.operand_values(op, &operands, ospan, 1)?[0];
            Instr::Unary { dst, op: uop, src }
        } else if let Some(bop) = BinaryOp::from_mnemonic(op) {
            arity(op, &operands, ospan, 2)?;
            Instr::Binary { dst, op: bop, lhs: operands[0].0, rhs: operands[1].0 }
        } else if let Some(rop) = ReduceOp::from_mnemonic(op) {
            let src = self.operand_values(op, &operands, ospan, 1)?[0];
            let mut a = Attrs::new(op, self.attrs()?, op_span);
            let axes = a.int_list("axes")?;
            let keepdim = a.flag("keepdim")?;
            a.finish()?;
            return Ok(Instr::Reduce { dst, op: rop, src, axes, keepdim });
        } else {
            match op {
                "where" => {
                    arity(op, &operands, ospan, 3)?;
                    let cond = match operands[0].0 {
                        Operand::Value(v) => v,
                        Operand::Scalar(_) => {
                            return err(operands[0].1, ParseErrorKind::OperandKind { op: op.into(), index: 0 })
                        }
                    };
                    Instr::Where { dst, cond, on_true: operands[1].0, on_false: operands[2].0 }
                }
                "cast" => {
                    let src = self.operand_values(op, &operands, ospan, 1)?[0];
                    let dtype = self.dtype()?;
                    Instr::Cast { dst, src, dtype }
                }
                "matmul" => {
                    let v = self.operand_values(op, &operands, ospan, 2)?;
                    Instr::MatMul { dst, lhs: v[0], rhs: v[1] }
                }
                "concat" => {
                    if operands.is_empty() {
                        return err(
                            ospan,
                            ParseErrorKind::Arity { op: op.into(), expected: OperandCount::AtLeast(1), found: 0 },
                        );
                    }
                    let srcs = self.operand_values(op, &operands, ospan, operands.len())?;
                    let mut a = Attrs::new(op, self.attrs()?, op_span);
                    let axis = a.int_or("axis", 0)?;
                    a.finish()?;
                    return Ok(Instr::Concat { dst, srcs, axis });
                }
                "slice" => {
                    let src = self.operand_values(op, &operands, ospan, 1)?[0];
                    let index = self.slice_index()?;
                    Attrs::new(op, self.attrs()?, op_span).finish()?;
                    return Ok(Instr::Slice { dst, src, index });
                }
                _ => {
                    let src = self.operand_values(op, &operands, ospan, 1)?[0];
                    let mut a = Attrs::new(op, self.attrs()?, op_span);
                    let instr = match op {
                        "transpose" => {
                            Instr::Transpose { dst, src, dim0: a.int_or("dim0", -2)?, dim1: a.int_or("dim1", -1)? }
                        }
                        "permute" => Instr::Permute { dst, src, perm: a.required_int_list("perm")? },
                        "reshape" => Instr::Reshape { dst, src, shape: a.required_int_list("shape")? },
                        "squeeze" => Instr::Squeeze { dst, src, axes: a.int_list("axes")? },
                        "unsqueeze" => Instr::Unsqueeze { dst, src, axis: a.required_int("axis")? },
                        "broadcast_to" => {
                            let shape = a.required_uint_list("shape")?.into_iter().map(|d| d as usize).collect();
                            Instr::BroadcastTo { dst, src, shape }
                        }
                        _ => unreachable!("is_op lists exactly the ops handled here: {op}"),
                    };
                    a.finish()?;
                    return Ok(instr);
                }
            }
        };
        Attrs::new(op, self.attrs()?, op_span).finish()?;
        Ok(instr)
    }

    /// Comma-separated operands: values, numbers or constant names. Stops at anything else.
    fn operands(&mut self) -> PResult<(Vec<(Operand, Span)>, Span)> {
        let mut out = Vec::new();
        let start = self.span();
        // With no operands, errors point at the op name rather than at what follows it.
        let op_span = self.prev_span();
        loop {
            let first = out.is_empty();
            let span = self.span();
            match self.peek().clone() {
                Tok::Value(n) => {
                    self.bump();
                    out.push((Operand::Value(self.value_id(&n)), span));
                }
                Tok::Number(_) | Tok::Minus => {
                    let (n, s) = self.number()?;
                    out.push((Operand::Scalar(exact_scalar(n, s)?), s));
                }
                // A word is an operand when it names a constant (or inf/nan) and is not `name=`.
                Tok::Ident(w)
                    if (self.consts.contains_key(&w) || w == "inf" || w == "nan") && self.peek_at(1) != &Tok::Eq =>
                {
                    let (n, s) = self.number()?;
                    out.push((Operand::Scalar(n.as_f64()), s));
                }
                _ if first => break,
                _ => return self.expected("an operand after `,`"),
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        let span = if out.is_empty() { op_span } else { start.to(self.prev_span()) };
        Ok((out, span))
    }

    fn operand_values(&self, op: &str, operands: &[(Operand, Span)], span: Span, n: usize) -> PResult<Vec<ValueId>> {
        arity(op, operands, span, n)?;
        operands
            .iter()
            .enumerate()
            .map(|(index, (o, s))| match o {
                Operand::Value(v) => Ok(*v),
                Operand::Scalar(_) => err(*s, ParseErrorKind::OperandKind { op: op.into(), index }),
            })
            .collect()
    }

    /// `name=value` and bare flags, up to the end of the statement.
    fn attrs(&mut self) -> PResult<Vec<Attr>> {
        let mut out = Vec::new();
        while let Tok::Ident(name) = self.peek().clone() {
            let span = self.span();
            self.bump();
            let value = if self.eat(&Tok::Eq) {
                if self.peek() == &Tok::LBracket {
                    AttrValue::List(self.number_list()?)
                } else {
                    AttrValue::Number(self.number()?.0)
                }
            } else {
                AttrValue::Flag
            };
            if out.iter().any(|a: &Attr| a.name == name) {
                return err(span, ParseErrorKind::DuplicateAttr { name });
            }
            out.push(Attr { name, span: span.to(self.prev_span()), value });
        }
        Ok(out)
    }

    /// A number: `[-] (literal | inf | nan | constant)`.
    fn number(&mut self) -> PResult<(Number, Span)> {
        let start = self.span();
        let neg = self.eat(&Tok::Minus);
        let (t, span) = self.bump();
        let span = start.to(span);
        let n = match t {
            // The sign is part of the literal, so that `-9223372036854775808` fits.
            Tok::Number(text) if neg => return Ok((parse_number(&format!("-{text}"), span)?, span)),
            Tok::Number(text) => parse_number(&text, span)?,
            Tok::Ident(w) if w == "inf" => Number::Float(f64::INFINITY),
            Tok::Ident(w) if w == "nan" => Number::Float(f64::NAN),
            Tok::Ident(w) => match self.consts.get(&w) {
                Some(n) => *n,
                None => {
                    let suggestion = suggest(&w, self.consts.keys());
                    return err(span, ParseErrorKind::UnknownConst { name: w, suggestion });
                }
            },
            t => return err(span, ParseErrorKind::Expected { expected: "a number", found: t.describe() }),
        };
        let n = match (neg, n) {
            (false, n) => n,
            (true, Number::Int(i)) => Number::Int(-i),
            (true, Number::Float(f)) => Number::Float(-f),
        };
        Ok((n, span))
    }

    fn uint(&mut self, what: &'static str) -> PResult<u64> {
        let (n, span) = self.number()?;
        match n {
            Number::Int(i) if u64::try_from(i).is_ok() => Ok(i as u64),
            _ => err(span, ParseErrorKind::ExpectedUint { what, found: fmt_number(n) }),
        }
    }

    /// `[a, b, ...]` of numbers (nested brackets are not allowed here).
    fn number_list(&mut self) -> PResult<Vec<(Number, Span)>> {
        self.expect(Tok::LBracket, "`[`")?;
        let mut out = Vec::new();
        self.skip_newlines();
        while self.peek() != &Tok::RBracket {
            out.push(self.number()?);
            self.skip_newlines();
            if !self.eat(&Tok::Comma) {
                break;
            }
            self.skip_newlines();
        }
        self.skip_newlines();
        self.expect(Tok::RBracket, "`,` or `]`")?;
        Ok(out)
    }

    /// Tensor data of `dtype`: a bracketed list of elements, possibly nested (flattened
    /// row-major). Floats parse straight to their dtype from their text, so printing and
    /// parsing round-trip; an element the dtype cannot hold (`1.5` or `3000000000` as `i32`,
    /// `70000` as `f16`) is an error at that element.
    fn elements(&mut self, dtype: DType) -> PResult<Elements> {
        let mut items = Vec::new();
        self.items_into(&mut items)?;
        Self::elements_of(items, dtype)
    }

    /// Data without a dtype (`expect %x == [...]`): `bool`s when every element is `true`
    /// or `false`, `i64`s when every one is a whole number written as one (exact, where
    /// `f64`s would round beyond 2^53), else `f64`s.
    fn untyped_elements(&mut self) -> PResult<Elements> {
        let mut items = Vec::new();
        self.items_into(&mut items)?;
        let dtype = if !items.is_empty() && items.iter().all(|(i, _)| matches!(i, Item::Bool(_))) {
            DType::Bool
        } else if !items.is_empty() && items.iter().all(|(i, _)| i.integer().is_some_and(|n| i64::try_from(n).is_ok()))
        {
            DType::I64
        } else {
            DType::F64
        };
        Self::elements_of(items, dtype)
    }

    fn elements_of(items: Vec<(Item, Span)>, dtype: DType) -> PResult<Elements> {
        let mut out = Elements::zeros(dtype, 0);
        for (item, span) in items {
            let bad = |reason: &'static str| ParseError {
                span,
                kind: ParseErrorKind::BadElement { text: item.text(), dtype, reason },
            };
            match &mut out {
                Elements::F32(v) => {
                    let x: f32 = match &item {
                        Item::Text(t) => t.parse().map_err(|_| bad("not a number"))?,
                        Item::Bool(_) => return Err(bad("not a number")),
                        Item::Number(n) => n.as_f64() as f32,
                    };
                    // `inf` is written as a word; a number written out that rounds to it is not.
                    if x.is_infinite() && matches!(item, Item::Text(_)) {
                        return Err(bad("beyond the largest f32, about 3.40e38"));
                    }
                    v.push(x);
                }
                Elements::F64(v) => {
                    let x = item.float().ok_or_else(|| bad("not a number"))?;
                    if x.is_infinite() && matches!(item, Item::Text(_)) {
                        return Err(bad("beyond the largest f64, about 1.80e308"));
                    }
                    v.push(x);
                }
                Elements::F16(v) => {
                    let x = item.float().ok_or_else(|| bad("not a number"))?;
                    let h = crate::data::f16_of(x);
                    if h.is_infinite() && x.is_finite() {
                        return Err(bad("beyond the largest f16, 65504"));
                    }
                    v.push(h);
                }
                Elements::BF16(v) => {
                    let x = item.float().ok_or_else(|| bad("not a number"))?;
                    let h = crate::data::bf16_of(x);
                    if h.is_infinite() && x.is_finite() {
                        return Err(bad("beyond the largest bf16, about 3.39e38"));
                    }
                    v.push(h);
                }
                Elements::I64(v) => {
                    let i =
                        item.integer().ok_or_else(|| bad(item.not_integer("beyond the i64 range", 2f64.powi(63))))?;
                    v.push(i64::try_from(i).map_err(|_| bad("beyond the i64 range"))?);
                }
                Elements::I32(v) => {
                    let range = "beyond the i32 range, -2147483648 to 2147483647";
                    let i = item.integer().ok_or_else(|| bad(item.not_integer(range, 2f64.powi(31))))?;
                    v.push(i32::try_from(i).map_err(|_| bad(range))?);
                }
                Elements::Bool(v) => v.push(match (&item, item.integer()) {
                    (Item::Bool(b), _) => *b,
                    (_, Some(0)) => false,
                    (_, Some(1)) => true,
                    _ => return Err(bad("not `true`, `false`, 0 or 1")),
                }),
            }
        }
        Ok(out)
    }

    fn items_into(&mut self, out: &mut Vec<(Item, Span)>) -> PResult<()> {
        self.expect(Tok::LBracket, "`[` to start the data")?;
        self.enter()?;
        self.skip_newlines();
        while self.peek() != &Tok::RBracket {
            if self.peek() == &Tok::LBracket {
                self.items_into(out)?;
            } else {
                out.push(self.item()?);
            }
            self.skip_newlines();
            if !self.eat(&Tok::Comma) {
                break;
            }
            self.skip_newlines();
        }
        self.expect(Tok::RBracket, "`,` or `]`")?;
        self.depth -= 1;
        Ok(())
    }

    /// One element as written: a number keeps its text, `true`/`false` are booleans.
    fn item(&mut self) -> PResult<(Item, Span)> {
        let neg = self.peek() == &Tok::Minus;
        if let Tok::Number(text) = self.peek_at(usize::from(neg)).clone() {
            let start = self.span();
            if neg {
                self.bump();
            }
            let span = start.to(self.bump().1);
            return Ok((Item::Text(if neg { format!("-{text}") } else { text }), span));
        }
        if let Tok::Ident(w) = self.peek() {
            let b = match w.as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            };
            if let Some(b) = b {
                let span = self.bump().1;
                return Ok((Item::Bool(b), span));
            }
        }
        let (n, span) = self.number()?;
        Ok((Item::Number(n), span))
    }

    fn dtype(&mut self) -> PResult<DType> {
        match self.bump() {
            (Tok::Ident(n), span) => DType::from_name(&n).ok_or_else(|| ParseError {
                span,
                kind: ParseErrorKind::UnknownDType {
                    suggestion: suggest(&n, DType::ALL.iter().map(|d| d.name())),
                    name: n,
                },
            }),
            (t, span) => err(span, ParseErrorKind::Expected { expected: "a dtype like `f32`", found: t.describe() }),
        }
    }

    /// `f32[2, 3]`
    fn tensor_type(&mut self) -> PResult<TensorType> {
        let dtype = self.dtype()?;
        if self.peek() != &Tok::LBracket {
            return self.expected("`[` and the dimensions, as in `f32[2, 3]`");
        }
        let dims = self
            .number_list()?
            .into_iter()
            .map(|(n, span)| match n {
                Number::Int(i) if i >= 0 && usize::try_from(i).is_ok() => Ok(i as usize),
                _ => err(
                    span,
                    ParseErrorKind::Expected { expected: "a dimension (an integer >= 0)", found: fmt_number(n) },
                ),
            })
            .collect::<PResult<Vec<_>>>()?;
        Ok(TensorType { dtype, shape: Shape(dims.into()) })
    }

    /// `[0:2, ::2, 1, new, ...]`
    fn slice_index(&mut self) -> PResult<Vec<SliceItem>> {
        self.expect(Tok::LBracket, "`[` and the slice items, as in `[0:2, ::-1, 3, new, ...]`")?;
        let mut out = Vec::new();
        while self.peek() != &Tok::RBracket {
            let item = match self.peek() {
                Tok::Ellipsis => {
                    self.bump();
                    SliceItem::Ellipsis
                }
                Tok::Ident(w) if w == "new" => {
                    self.bump();
                    SliceItem::NewAxis
                }
                _ => {
                    let start = self.opt_int()?;
                    if self.eat(&Tok::Colon) {
                        let end = self.opt_int()?;
                        let step = if self.eat(&Tok::Colon) { self.opt_int()?.unwrap_or(1) } else { 1 };
                        SliceItem::Range { start, end, step }
                    } else {
                        match start {
                            Some(i) => SliceItem::Index(i),
                            None => return self.expected("a slice item (`a:b:c`, an index, `new` or `...`)"),
                        }
                    }
                }
            };
            out.push(item);
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(Tok::RBracket, "`,` or `]`")?;
        Ok(out)
    }

    fn opt_int(&mut self) -> PResult<Option<i64>> {
        match self.peek() {
            Tok::Number(_) | Tok::Minus | Tok::Ident(_) => {
                let (n, span) = self.number()?;
                match n {
                    Number::Int(i) if i64::try_from(i).is_ok() => Ok(Some(i as i64)),
                    n => err(span, ParseErrorKind::Expected { expected: "a 64-bit integer", found: fmt_number(n) }),
                }
            }
            _ => Ok(None),
        }
    }

    fn expectation(&mut self) -> PResult<StmtKind> {
        let src = self.value_use()?;
        let cmp = match self.bump() {
            (Tok::EqEq, _) => Comparison::Exact,
            (Tok::Approx, _) => Comparison::Close { tol: 0.0 },
            (t, span) => return err(span, ParseErrorKind::Expected { expected: "`==` or `~=`", found: t.describe() }),
        };
        let ty = if matches!(self.peek(), Tok::Ident(_)) { Some(self.tensor_type()?) } else { None };
        // Without a type, the values are converted to the value's dtype to compare.
        let data = match &ty {
            Some(t) => self.elements(t.dtype)?,
            None => self.untyped_elements()?,
        };
        let mut a = Attrs::new("expect", self.attrs()?, self.prev_span());
        let cmp = match cmp {
            Comparison::Close { .. } => Comparison::Close { tol: a.float_or("tol", DEFAULT_TOL)? },
            Comparison::Exact => Comparison::Exact,
        };
        a.finish()?;
        Ok(StmtKind::Expect { src, cmp, ty, data })
    }
}

/// A scalar's value: an integer written out must be one `f64` holds exactly (any up to
/// 2^53), or `add %x, 9007199254740993` would add 2^53.
fn exact_scalar(n: Number, span: Span) -> PResult<f64> {
    let x = n.as_f64();
    match n {
        // `x as i128` saturates, so 2^127 and above never equals `i`.
        Number::Int(i) if x as i128 != i => err(span, ParseErrorKind::InexactScalar { text: i.to_string() }),
        _ => Ok(x),
    }
}

/// Tolerance of `expect ~=` when none is written.
pub const DEFAULT_TOL: f64 = 1e-5;

fn is_op(word: &str) -> bool {
    mnemonics().contains(&word)
}

fn arity(op: &str, operands: &[(Operand, Span)], span: Span, n: usize) -> PResult<()> {
    if operands.len() != n {
        return err(
            span,
            ParseErrorKind::Arity { op: op.into(), expected: OperandCount::Exactly(n), found: operands.len() },
        );
    }
    Ok(())
}

/// A tensor element as written, before its dtype decides what it must be.
enum Item {
    /// A number as written (sign included), parsed by the dtype.
    Text(String),
    /// `inf`, `nan` or a named constant.
    Number(Number),
    /// `true` or `false`.
    Bool(bool),
}

impl Item {
    fn text(&self) -> String {
        match self {
            Item::Text(t) => t.clone(),
            Item::Number(n) => fmt_number(*n),
            Item::Bool(b) => b.to_string(),
        }
    }

    fn float(&self) -> Option<f64> {
        match self {
            Item::Text(t) => t.parse().ok(),
            Item::Number(n) => Some(n.as_f64()),
            Item::Bool(_) => None,
        }
    }

    /// Why an element that is not [`Item::integer`] is no integer element: `beyond` for a
    /// whole number written as a float at or past `limit` in magnitude (`1e19` as `i64`).
    fn not_integer(&self, beyond: &'static str, limit: f64) -> &'static str {
        match self.float() {
            Some(x) if x.is_finite() && x.fract() == 0.0 && x.abs() >= limit => beyond,
            _ => "not an integer",
        }
    }

    /// The value when it is a whole number written as one (`2`, not `2.0`).
    fn integer(&self) -> Option<i128> {
        match self {
            Item::Text(t) => t.parse().ok(),
            Item::Number(Number::Int(i)) => Some(*i),
            _ => None,
        }
    }
}

fn parse_number(text: &str, span: Span) -> PResult<Number> {
    if text.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<i128>()
            .map(Number::Int)
            .map_err(|_| ParseError { span, kind: ParseErrorKind::IntegerOverflow { text: text.into() } });
    }
    text.parse::<f64>()
        .map(Number::Float)
        .map_err(|_| ParseError { span, kind: ParseErrorKind::BadNumber { text: text.into() } })
}

fn fmt_number(n: Number) -> String {
    match n {
        Number::Int(i) => i.to_string(),
        Number::Float(f) => format!("{f:?}"),
    }
}

/// The attributes of one statement, consumed by name; `finish` rejects leftovers.
struct Attrs {
    op: String,
    attrs: Vec<Attr>,
    used: Vec<&'static str>,
    span: Span,
}

impl Attrs {
    fn new(op: &str, attrs: Vec<Attr>, span: Span) -> Attrs {
        Attrs { op: op.to_string(), attrs, used: Vec::new(), span }
    }

    fn has(&self, name: &str) -> bool {
        self.attrs.iter().any(|a| a.name == name)
    }

    fn take(&mut self, name: &'static str) -> Option<Attr> {
        self.used.push(name);
        let i = self.attrs.iter().position(|a| a.name == name)?;
        Some(self.attrs.remove(i))
    }

    fn kind_err<T>(&self, a: &Attr, expected: &'static str) -> PResult<T> {
        err(a.span, ParseErrorKind::AttrKind { op: self.op.clone(), name: a.name.clone(), expected })
    }

    fn missing<T>(&self, name: &'static str) -> PResult<T> {
        err(self.span, ParseErrorKind::MissingAttr { op: self.op.clone(), name })
    }

    fn number(&mut self, name: &'static str) -> PResult<Option<Number>> {
        match self.take(name) {
            None => Ok(None),
            Some(a) => match a.value {
                AttrValue::Number(n) => Ok(Some(n)),
                _ => self.kind_err(&a, "a number"),
            },
        }
    }

    fn float_or(&mut self, name: &'static str, default: f64) -> PResult<f64> {
        Ok(self.number(name)?.map_or(default, Number::as_f64))
    }

    fn required_float(&mut self, name: &'static str) -> PResult<f64> {
        match self.number(name)? {
            Some(n) => Ok(n.as_f64()),
            None => self.missing(name),
        }
    }

    /// An integer attribute: any `i64`, or with `nonneg` any `u64` (returned as `i128`).
    fn int_attr(&mut self, name: &'static str, nonneg: bool) -> PResult<Option<i128>> {
        let span = self.attrs.iter().find(|a| a.name == name).map(|a| a.span);
        let fits = |i: i128| if nonneg { u64::try_from(i).is_ok() } else { i64::try_from(i).is_ok() };
        match self.number(name)? {
            None => Ok(None),
            Some(Number::Int(i)) if fits(i) => Ok(Some(i)),
            Some(_) => err(
                span.unwrap_or(self.span),
                ParseErrorKind::AttrKind {
                    op: self.op.clone(),
                    name: name.into(),
                    expected: if nonneg { "an integer >= 0" } else { "an integer" },
                },
            ),
        }
    }

    fn int_or(&mut self, name: &'static str, default: i64) -> PResult<i64> {
        Ok(self.int_attr(name, false)?.map_or(default, |i| i as i64))
    }

    fn required_int(&mut self, name: &'static str) -> PResult<i64> {
        match self.int_attr(name, false)? {
            Some(i) => Ok(i as i64),
            None => self.missing(name),
        }
    }

    fn uint_or(&mut self, name: &'static str, default: u64) -> PResult<u64> {
        Ok(self.int_attr(name, true)?.map_or(default, |i| i as u64))
    }

    fn required_uint(&mut self, name: &'static str) -> PResult<u64> {
        match self.int_attr(name, true)? {
            Some(i) => Ok(i as u64),
            None => self.missing(name),
        }
    }

    fn list(&mut self, name: &'static str, nonneg: bool) -> PResult<Option<Vec<i64>>> {
        let Some(a) = self.take(name) else { return Ok(None) };
        let AttrValue::List(items) = &a.value else { return self.kind_err(&a, "a list like `[0, 1]`") };
        items
            .iter()
            .map(|(n, _)| match n {
                Number::Int(i) if i64::try_from(*i).is_ok() && (!nonneg || *i >= 0) => Ok(*i as i64),
                _ => self.kind_err(&a, if nonneg { "a list of integers >= 0" } else { "a list of integers" }),
            })
            .collect::<PResult<Vec<_>>>()
            .map(Some)
    }

    fn int_list(&mut self, name: &'static str) -> PResult<Option<Vec<i64>>> {
        self.list(name, false)
    }

    fn required_int_list(&mut self, name: &'static str) -> PResult<Vec<i64>> {
        match self.list(name, false)? {
            Some(l) => Ok(l),
            None => self.missing(name),
        }
    }

    fn uint_list(&mut self, name: &'static str) -> PResult<Option<Vec<usize>>> {
        Ok(self.list(name, true)?.map(|l| l.into_iter().map(|i| i as usize).collect()))
    }

    fn required_uint_list(&mut self, name: &'static str) -> PResult<Vec<u64>> {
        match self.list(name, true)? {
            Some(l) => Ok(l.into_iter().map(|i| i as u64).collect()),
            None => self.missing(name),
        }
    }

    fn flag(&mut self, name: &'static str) -> PResult<bool> {
        match self.take(name) {
            None => Ok(false),
            Some(a) => match a.value {
                AttrValue::Flag => Ok(true),
                _ => self.kind_err(&a, "a bare flag (no `=`)"),
            },
        }
    }

    fn allow_only_one_of(&mut self, a: &'static str, b: &'static str) -> PResult<()> {
        if self.has(a) && self.has(b) {
            let span = self.attrs.iter().find(|x| x.name == a).map_or(self.span, |x| x.span);
            return err(span, ParseErrorKind::ConflictingAttrs { op: self.op.clone(), a, b });
        }
        Ok(())
    }

    fn finish(self) -> PResult<()> {
        if let Some(a) = self.attrs.first() {
            return err(
                a.span,
                ParseErrorKind::UnknownAttr {
                    op: self.op.clone(),
                    suggestion: suggest(&a.name, &self.used),
                    name: a.name.clone(),
                    allowed: self.used.clone(),
                },
            );
        }
        Ok(())
    }
}
