//! Lowering a `gt!` invocation: each statement's text goes through the `.gtir` parser (which
//! checks ops, arity, attributes, types and numbers), its names are resolved (earlier `gt!`
//! values or Rust variables), its operands renumbered `ValueId(0..)` in first-use order, and
//! code is emitted that builds the instruction and runs it with
//! `::gt::frontend::tensor::apply_instr`. Errors are compile errors at the input tokens.

use crate::emit::Emitter;
use crate::text::{self, Error, Hole, PieceKind, Statement};
use gt_ir::text::{ParseError, ParseErrorKind};
use gt_ir::{Instr, StmtKind, TypeError, ValueId};
use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use std::collections::HashMap;

/// Script statements of `.gtir` that `gt!` refuses, with what to do instead.
const SCRIPT_ONLY: &[(&str, &str)] = &[
    ("print", "read values in Rust instead (`y.to_vec()?`, `println!(\"{y:?}\")`)"),
    ("expect", "compare values in Rust instead (`assert_eq!(y.to_vec()?, [..])`)"),
    ("repeat", "write a Rust loop around `gt!` instead"),
    ("signal", "open a scope in Rust instead (`let _s = gt::signal::context(\"name\")?;`)"),
    ("signal_start", "open a scope in Rust instead (`let _s = gt::signal::context(\"name\")?;`)"),
    ("signal_end", "a scope closes when its `gt::signal::context` guard drops"),
    ("const", "use a Rust value in braces where a number goes instead, as in `{N}`"),
    ("free", "drop the Rust binding instead (values are freed when their last handle drops)"),
    ("get", "read values in Rust instead (`y.to_vec()?`)"),
    ("hotpath_start", "hot-path markers are inserted by the runtime's `hotpath` pass"),
    ("hotpath_end", "hot-path markers are inserted by the runtime's `hotpath` pass"),
    ("requires_grad", "call `.requires_grad_(true)?` in Rust instead"),
    ("backward", "call `loss.backward()?` in Rust instead"),
    ("zero_grad", "call `.zero_grad()` (or the optimizer's) in Rust instead"),
    ("sgd", "use `gt::nn::Sgd` in Rust instead"),
    ("adam", "use `gt::nn::Adam` in Rust instead"),
];

/// Ops after `%y =` that are not instructions, with why.
const NOT_INSTRUCTIONS: &[(&str, &str)] = &[
    ("fused", "`fused` kernels are made by the runtime's `fuse` pass; `gt!` cannot write them"),
    ("grad", "`grad` is a `.gtir` training statement; read a gradient in Rust instead (`w.grad()`)"),
];

/// Rust keywords, which cannot be binding names.
const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn",
    "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "Self",
    "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while", "abstract", "become",
    "box", "do", "final", "gen", "macro", "override", "priv", "try", "typeof", "unsized", "virtual", "yield",
];

/// Where an operand comes from.
enum Source {
    /// A value defined earlier in the same `gt!`: a `Tensor` binding.
    Local(Ident),
    /// A Rust variable in scope (`Tensor` or `&Tensor`).
    External(Ident),
}

/// One statement, lowered.
struct Lowered {
    /// Operands are `ValueId(0..operands.len())`, results the ids after them.
    instr: Instr,
    /// One binding per result.
    results: Vec<Ident>,
    /// The tensors behind `ValueId(0..)`.
    operands: Vec<Source>,
    /// The op's name token.
    op_span: Span,
}

/// The whole macro: `let` bindings for every value defined, or the compile errors.
pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let mut holes = Vec::new();
    let stmts = text::statements(input, &mut holes, refuse_script);
    let mut defined: HashMap<String, Ident> = HashMap::new();
    let mut emitter = Emitter::new(&holes);
    let mut code = TokenStream::new();
    let mut errors = Vec::new();
    for st in &stmts {
        match st.as_ref().map_err(|e| e.clone()).and_then(|st| {
            let l = lower(st, &mut defined)?;
            emit(&l, st, &mut emitter)
        }) {
            Ok(c) => code.extend(c),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        code
    } else {
        errors.iter().map(Error::to_tokens).collect()
    }
}

/// Refuses `.gtir` script statements and `fused` before they are written as text.
fn refuse_script(toks: &[TokenTree]) -> Option<Error> {
    if let Some(TokenTree::Ident(w)) = toks.first() {
        let word = w.to_string();
        if let Some((_, hint)) = SCRIPT_ONLY.iter().find(|(k, _)| *k == word) {
            return Some(Error::new(
                format!(
                    "`{word}` is a `.gtir` script statement; `gt!` takes instructions only (`%y = op ...`): {hint}"
                ),
                w.span(),
            ));
        }
    }
    let eq = toks.iter().position(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == '='))?;
    match toks.get(eq + 1) {
        Some(TokenTree::Ident(w)) => {
            let word = w.to_string();
            NOT_INSTRUCTIONS.iter().find(|(k, _)| *k == word).map(|(_, msg)| Error::new(*msg, w.span()))
        }
        _ => None,
    }
}

/// An identifier's name without `r#`.
fn unraw(id: &Ident) -> String {
    let s = id.to_string();
    s.strip_prefix("r#").map_or_else(|| s.clone(), str::to_string)
}

fn piece_text(st: &Statement, i: usize) -> &str {
    &st.text[st.pieces[i].range.clone()]
}

/// The index of the first top-level `=` piece (the one after the results).
fn eq_index(st: &Statement) -> Option<usize> {
    (0..st.pieces.len()).find(|&i| matches!(st.pieces[i].kind, PieceKind::Other) && piece_text(st, i) == "=")
}

fn lower(st: &Statement, defined: &mut HashMap<String, Ident>) -> Result<Lowered, Error> {
    let eq = eq_index(st);
    let program = gt_ir::text::parse(&st.text).map_err(|e| parse_error(st, &e))?;
    let instr = match program.body.as_slice() {
        [s] => match &s.kind {
            StmtKind::Instr(i @ (Instr::Free { .. } | Instr::GetData { .. })) => {
                return Err(Error::spanning(
                    format!("`{}` is a `.gtir` script statement; `gt!` takes instructions only", i.mnemonic()),
                    st.span().0,
                    st.span().1,
                ))
            }
            StmtKind::Instr(i) => i.clone(),
            _ => {
                let (a, b) = st.span();
                return Err(Error::spanning(
                    "this is a `.gtir` script statement; `gt!` takes instructions only (`%y = op ...`)",
                    a,
                    b,
                ));
            }
        },
        _ => {
            let (a, b) = st.span();
            return Err(Error::spanning("expected one instruction", a, b));
        }
    };
    let eq = eq.unwrap_or(0);
    let op_span = st.pieces.get(eq + 1).map_or_else(|| st.span().0, |p| p.first);
    let name = |v: ValueId| program.name(v);
    // Each `%name` token: its name, identifier and the span of the `%`.
    let value_pieces = |range: std::ops::Range<usize>| {
        st.pieces[range]
            .iter()
            .filter_map(|p| match &p.kind {
                PieceKind::Value(id) => Some((unraw(id), id.clone(), p.first)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // The parser keeps results in text order: they are the values before the `=`.
    let result_idents = value_pieces(0..eq);
    let operand_idents = value_pieces(eq..st.pieces.len());
    let ident_of = |n: &str, among: &[(String, Ident, Span)]| {
        among.iter().find(|(name, ..)| name == n).map(|(_, id, pct)| (id.clone(), *pct)).expect("a token per name")
    };

    let mut ops: Vec<ValueId> = Vec::new();
    for v in instr.operands() {
        if !ops.contains(&v) {
            ops.push(v);
        }
    }
    let operands = ops
        .iter()
        .map(|&v| {
            let n = name(v);
            let (id, _) = ident_of(&n, &operand_idents);
            if defined.contains_key(&n) {
                Source::Local(id)
            } else {
                Source::External(id)
            }
        })
        .collect::<Vec<_>>();

    let mut results: Vec<Ident> = Vec::new();
    for (k, v) in instr.results().into_iter().enumerate() {
        let n = name(v);
        // The k-th result is the k-th `%name` before the `=` (the parser keeps text order).
        let (_, id, pct) = result_idents[k].clone();
        if KEYWORDS.contains(&n.as_str()) {
            return Err(Error::spanning(format!("`%{n}` cannot be bound: `{n}` is a Rust keyword"), pct, id.span()));
        }
        if defined.contains_key(&n) || results.iter().any(|r| unraw(r) == n) {
            return Err(Error::spanning(
                format!(
                    "`%{n}` is already defined in this `gt!` (each value is defined once); give the new value \
                     another name"
                ),
                pct,
                id.span(),
            ));
        }
        results.push(id);
    }
    for r in &results {
        defined.insert(unraw(r), r.clone());
    }

    // Renumber: operands 0.. in first-use order, results after them (`apply_instr` reads
    // operand `k` from the k-th tensor given and ignores result ids).
    let mut instr = instr;
    let nres = instr.num_results();
    let mut i = 0;
    instr.visit_values_mut(&mut |v| {
        *v = if i < nres {
            ValueId((ops.len() + i) as u32)
        } else {
            ValueId(ops.iter().position(|o| o == v).expect("an operand") as u32)
        };
        i += 1;
    });

    // Creation ops have no operands: their types are known now, so check them now.
    let has_holes = st.pieces.iter().any(|p| matches!(p.kind, PieceKind::Hole(_)));
    if ops.is_empty() && !has_holes {
        if let Err(e) = gt_ir::verify::shape::infer(&instr, &|v| Err(TypeError::UnknownValue(v))) {
            let (a, b) = st.span();
            return Err(Error::spanning(format!("{}: {e}", instr.mnemonic()), a, b));
        }
    }
    Ok(Lowered { instr, results, operands, op_span })
}

/// A parse error of the statement's text, at the input tokens it names.
fn parse_error(st: &Statement, e: &ParseError) -> Error {
    let (first, last) = st.tokens_at(e.span.start as usize, e.span.end as usize);
    let mut msg = match &e.kind {
        ParseErrorKind::UnknownConst { name, .. } => {
            format!("expected a number, found `{name}`; a Rust value goes in braces: `{{{name}}}`")
        }
        ParseErrorKind::UnknownStatement { word, .. } => {
            format!("unknown statement `{word}`; `gt!` statements are `%y = op ...`")
        }
        ParseErrorKind::Expected { expected, found }
            if (expected.contains("operand") || expected.contains("number"))
                && found.starts_with('`')
                && found[1..].chars().next().is_some_and(|c| c.is_alphabetic() || c == '_') =>
        {
            let word = found.trim_matches('`');
            format!("{e}\nhelp: a Rust value goes in braces: `{{{word}}}`")
        }
        _ => e.to_string(),
    };
    if let Some(help) = e.help() {
        if !matches!(e.kind, ParseErrorKind::UnknownConst { .. }) {
            msg = format!("{msg}\nhelp: {help}");
        }
    }
    // The text is one statement of the macro, not a file; holes are written as sentinels.
    msg = msg.replace("end of file", "the end of the statement").replace("end of line", "the end of the statement");
    for p in &st.pieces {
        if let PieceKind::Hole(k) = p.kind {
            msg = msg.replace(&format!("number `{}`", text::sentinel(k)), "a `{..}` expression");
        }
    }
    Error::spanning(msg, first, last)
}

fn emit(l: &Lowered, st: &Statement, emitter: &mut Emitter<'_>) -> Result<TokenStream, Error> {
    let instr_tokens = emitter.instr(&l.instr);
    let (hole_lets, used) = emitter.take_hole_lets();
    for p in &st.pieces {
        if let PieceKind::Hole(k) = p.kind {
            if !used.contains(&k) {
                return Err(Error::new("a `{..}` expression stands only where a number does", p.first));
            }
        }
    }
    let results = &l.results;
    let n = results.len();
    let op = l.instr.mnemonic();
    let question = quote_spanned!(l.op_span=> ?);
    let operands = l.operands.iter().map(|o| match o {
        Source::Local(id) => quote!(&#id),
        Source::External(id) => quote_spanned!(id.span()=> ::std::borrow::Borrow::<::gt::Tensor>::borrow(&#id)),
    });
    let [instr, out, found, vals] =
        ["instr", "out", "found", "values"].map(|s| format_ident!("__gt_{}", s, span = Span::mixed_site()));
    Ok(quote! {
        let [#(#results),*]: [::gt::Tensor; #n] = {
            #hole_lets
            let #instr: ::gt::ir::Instr = #instr_tokens;
            let #out = ::gt::frontend::tensor::apply_instr(&#instr, &[#(#operands),*]) #question;
            let #found = #out.len();
            match <[::gt::Tensor; #n] as ::core::convert::TryFrom<::std::vec::Vec<::gt::Tensor>>>::try_from(#out) {
                ::core::result::Result::Ok(#vals) => #vals,
                ::core::result::Result::Err(_) => {
                    return ::core::result::Result::Err(::core::convert::From::from(::gt::TensorError::Invalid {
                        op: #op,
                        misuse: ::gt::frontend::tensor::Misuse::ResultCount { found: #found, named: #n },
                    }))
                }
            }
        };
    })
}

/// `gtir_instrs!`: every instruction of a `.gtir` text, as an expression of type
/// `Vec<::gt::ir::Instr>` (ids as parsed). For tests of [`Emitter::instr`].
pub(crate) fn instrs_of_text(input: TokenStream) -> TokenStream {
    // A `$text:literal` from `macro_rules!` arrives in an invisible group.
    let mut it = input.into_iter().flat_map(|t| match t {
        TokenTree::Group(g) if g.delimiter() == proc_macro2::Delimiter::None => g.stream().into_iter().collect(),
        t => vec![t],
    });
    let lit = match (it.next(), it.next()) {
        (Some(proc_macro2::TokenTree::Literal(l)), None) => l,
        _ => return Error::new("expected one string literal of `.gtir` text", Span::call_site()).to_tokens(),
    };
    let Some(src) = string_value(&lit.to_string()) else {
        return Error::new("expected a raw string literal (`r#\"...\"#`)", lit.span()).to_tokens();
    };
    match gt_ir::text::parse(&src) {
        Ok(program) => {
            let mut emitter = Emitter::new(&[] as &[Hole]);
            let items = program.instrs().into_iter().map(|(i, _)| emitter.instr(i)).collect::<Vec<_>>();
            quote!(::std::vec![#(#items),*])
        }
        Err(e) => Error::new(format!("{e} (at bytes {:?})", e.span.range()), lit.span()).to_tokens(),
    }
}

/// The value of a raw string literal's text (`r"..."`, `r#"..."#`), or of a plain one
/// without escapes.
fn string_value(lit: &str) -> Option<String> {
    if let Some(raw) = lit.strip_prefix('r') {
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        let inner = raw.get(hashes..raw.len().checked_sub(hashes)?)?;
        return Some(inner.strip_prefix('"')?.strip_suffix('"')?.to_string());
    }
    let inner = lit.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then(|| inner.to_string())
}
