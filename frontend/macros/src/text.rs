//! The macro's tokens as `.gtir` text, one statement at a time: every piece of text written
//! remembers the tokens it came from (so that the parser's byte-offset errors point back at
//! the macro input), and each `{expr}` hole is written as a sentinel number that the
//! lowering recognises in the parsed instruction.

use proc_macro2::{Delimiter, Group, Ident, Spacing, Span, TokenStream, TokenTree};
use quote::quote_spanned;
use std::ops::Range;

/// A compile error spanning the tokens `first..=last` of the macro input.
#[derive(Clone)]
pub(crate) struct Error {
    msg: String,
    first: Span,
    last: Span,
}

impl Error {
    /// An error at one token.
    pub(crate) fn new(msg: impl Into<String>, span: Span) -> Error {
        Error { msg: msg.into(), first: span, last: span }
    }

    /// An error from the token at `first` to the one at `last`.
    pub(crate) fn spanning(msg: impl Into<String>, first: Span, last: Span) -> Error {
        Error { msg: msg.into(), first, last }
    }

    /// `::core::compile_error! { "msg" }` whose tokens carry the first and last spans, so
    /// that rustc underlines everything between them (stable proc macros cannot join spans).
    pub(crate) fn to_tokens(&self) -> TokenStream {
        let msg = &self.msg;
        let head = quote_spanned!(self.first=> ::core::compile_error!);
        let body = quote_spanned!(self.last=> { #msg });
        quote_spanned!(self.last=> #head #body)
    }
}

/// What a piece of text is.
#[derive(Clone)]
pub(crate) enum PieceKind {
    /// A bare word (op, attribute, dtype, keyword).
    Word,
    /// `%name`: the identifier after the `%`.
    Value(Ident),
    /// A `{expr}` hole: its index in [`Holes`].
    Hole(usize),
    /// Punctuation, a literal or a bracket.
    Other,
}

/// A piece of the text and the tokens it came from.
#[derive(Clone)]
pub(crate) struct Piece {
    /// Its bytes in the statement's text.
    pub(crate) range: Range<usize>,
    /// The first token it came from.
    pub(crate) first: Span,
    /// The last token it came from.
    pub(crate) last: Span,
    /// What it is.
    pub(crate) kind: PieceKind,
}

/// A `{expr}` where a number goes: a Rust expression evaluated at run time.
pub(crate) struct Hole {
    /// The braces and the expression.
    pub(crate) group: Group,
}

/// Holes are written as `(HOLE_BASE + k) << HOLE_SHIFT`: integers exact as `f32`, `f64`,
/// `i64`, `u64` and `usize`, which no one writes by hand, so that every typed field of the
/// parsed instruction still shows which hole it came from.
const HOLE_BASE: i128 = 0xB5_A5A5;
const HOLE_SHIFT: u32 = 20;
/// At most this many holes in one macro (the sentinels must stay exact as `f32`).
const MAX_HOLES: usize = (1 << 24) - HOLE_BASE as usize;

/// The number written for hole `k`.
pub(crate) fn sentinel(k: usize) -> i128 {
    (HOLE_BASE + k as i128) << HOLE_SHIFT
}

/// The hole a number stands for (`Some((k, negated))`), if it is a sentinel.
pub(crate) fn hole_of(v: i128, count: usize) -> Option<(usize, bool)> {
    let (abs, neg) = if v < 0 { (-v, true) } else { (v, false) };
    if abs & ((1 << HOLE_SHIFT) - 1) != 0 {
        return None;
    }
    let k = (abs >> HOLE_SHIFT) - HOLE_BASE;
    (0..count as i128).contains(&k).then_some((k as usize, neg))
}

/// The holes of one macro invocation, in order.
pub(crate) type Holes = Vec<Hole>;

/// One statement (the tokens up to a `;`) as `.gtir` text.
pub(crate) struct Statement {
    /// The text (one line).
    pub(crate) text: String,
    /// Every piece of the text, in order.
    pub(crate) pieces: Vec<Piece>,
    /// The `;` that ends it, if one does.
    pub(crate) semi: Option<Span>,
}

impl Statement {
    /// The first and last tokens of the whole statement.
    pub(crate) fn span(&self) -> (Span, Span) {
        match (self.pieces.first(), self.pieces.last()) {
            (Some(a), Some(b)) => (a.first, b.last),
            _ => (Span::call_site(), Span::call_site()),
        }
    }

    /// The tokens behind the bytes `start..end` of the text (an empty range: the token at
    /// `start`, or the end of the statement).
    pub(crate) fn tokens_at(&self, start: usize, end: usize) -> (Span, Span) {
        let end = end.max(start + 1);
        let hit: Vec<&Piece> = self.pieces.iter().filter(|p| p.range.start < end && p.range.end > start).collect();
        match (hit.first(), hit.last()) {
            (Some(a), Some(b)) => (a.first, b.last),
            _ => {
                let at = self.semi.or(self.pieces.last().map(|p| p.last)).unwrap_or_else(Span::call_site);
                (at, at)
            }
        }
    }
}

/// Splits the macro input at `;` and writes each statement as text, in order; `check` sees
/// each statement's tokens first and may refuse it. Empty statements are skipped.
pub(crate) fn statements(
    input: TokenStream,
    holes: &mut Holes,
    check: impl Fn(&[TokenTree]) -> Option<Error>,
) -> Vec<Result<Statement, Error>> {
    let mut out = Vec::new();
    let mut current: Vec<TokenTree> = Vec::new();
    let mut finish = |toks: &mut Vec<TokenTree>, semi: Option<Span>| {
        if toks.is_empty() {
            return;
        }
        if let Some(e) = check(toks) {
            toks.clear();
            out.push(Err(e));
            return;
        }
        let mut w = Writer { text: String::new(), pieces: Vec::new(), glue: false, holes: &mut *holes };
        out.push(w.trees(std::mem::take(toks)).map(|()| Statement { text: w.text, pieces: w.pieces, semi }));
    };
    for tt in flatten(input) {
        match &tt {
            TokenTree::Punct(p) if p.as_char() == ';' => finish(&mut current, Some(p.span())),
            _ => current.push(tt),
        }
    }
    finish(&mut current, None);
    out
}

/// The token trees of a stream, with invisible groups (from `macro_rules!` fragments) opened.
fn flatten(ts: TokenStream) -> Vec<TokenTree> {
    let mut out = Vec::new();
    for tt in ts {
        match tt {
            TokenTree::Group(g) if g.delimiter() == Delimiter::None => out.extend(flatten(g.stream())),
            tt => out.push(tt),
        }
    }
    out
}

struct Writer<'h> {
    text: String,
    pieces: Vec<Piece>,
    /// The previous token was a joint punctuation (`.` of `...`): no space before the next.
    glue: bool,
    holes: &'h mut Holes,
}

impl Writer<'_> {
    fn push(&mut self, s: &str, first: Span, last: Span, kind: PieceKind) {
        if !self.glue && !self.text.is_empty() {
            self.text.push(' ');
        }
        let start = self.text.len();
        self.text.push_str(s);
        self.pieces.push(Piece { range: start..self.text.len(), first, last, kind });
        self.glue = false;
    }

    fn trees(&mut self, toks: Vec<TokenTree>) -> Result<(), Error> {
        let mut it = toks.into_iter().peekable();
        while let Some(tt) = it.next() {
            match tt {
                TokenTree::Punct(p) if p.as_char() == '%' => match it.next() {
                    Some(TokenTree::Ident(id)) => {
                        let name = id.to_string();
                        let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
                        self.push(&format!("%{name}"), p.span(), id.span(), PieceKind::Value(id));
                    }
                    Some(TokenTree::Literal(l)) => {
                        return Err(Error::spanning(
                            format!("value names in `gt!` are Rust identifiers (`%x{l}`, not `%{l}`)"),
                            p.span(),
                            l.span(),
                        ))
                    }
                    _ => return Err(Error::new("`%` must be followed by a name, as in `%x`", p.span())),
                },
                TokenTree::Punct(p) if p.as_char() == ';' => {
                    return Err(Error::new("`;` ends a statement and cannot stand inside brackets", p.span()))
                }
                TokenTree::Punct(p) => {
                    self.push(&p.as_char().to_string(), p.span(), p.span(), PieceKind::Other);
                    self.glue = p.spacing() == Spacing::Joint;
                }
                TokenTree::Ident(id) => {
                    let word = id.to_string();
                    let word = word.strip_prefix("r#").unwrap_or(&word).to_string();
                    self.push(&word, id.span(), id.span(), PieceKind::Word);
                }
                TokenTree::Literal(l) => self.push(&l.to_string(), l.span(), l.span(), PieceKind::Other),
                TokenTree::Group(g) => match g.delimiter() {
                    Delimiter::Bracket => {
                        self.push("[", g.span_open(), g.span_open(), PieceKind::Other);
                        self.trees(flatten(g.stream()))?;
                        self.push("]", g.span_close(), g.span_close(), PieceKind::Other);
                    }
                    Delimiter::Brace => {
                        if g.stream().is_empty() {
                            return Err(Error::new(
                                "empty `{}`: a Rust expression goes inside, as in `{lr}`",
                                g.span(),
                            ));
                        }
                        let k = self.holes.len();
                        if k >= MAX_HOLES {
                            return Err(Error::new("too many `{..}` expressions in one `gt!`", g.span()));
                        }
                        self.holes.push(Hole { group: g.clone() });
                        self.push(&sentinel(k).to_string(), g.span(), g.span(), PieceKind::Hole(k));
                    }
                    Delimiter::Parenthesis => {
                        return Err(Error::new(
                            "parentheses have no meaning in `gt!`: operands are `%name`s or numbers, \
                             and a Rust expression goes in braces, as in `{2.0 * lr}`",
                            g.span(),
                        ))
                    }
                    Delimiter::None => self.trees(flatten(g.stream()))?,
                },
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(src: &str) -> Vec<String> {
        let mut holes = Vec::new();
        statements(src.parse().unwrap(), &mut holes, |_| None).into_iter().map(|s| s.ok().unwrap().text).collect()
    }

    #[test]
    fn statements_become_gtir_lines() {
        assert_eq!(
            text("%h = sum %x axes=[1, -1] keepdim; %a, %b = split %h size=2 axis=1;"),
            ["%h = sum %x axes = [ 1 , - 1 ] keepdim", "%a , %b = split %h size = 2 axis = 1"]
        );
        assert_eq!(text("%s = slice %x [1:3, ::-1, ..., new]"), ["%s = slice %x [ 1 : 3 , ::- 1 , ..., new ]"]);
        assert_eq!(text("%r = randn f32[4, 8] seed=3"), ["%r = randn f32 [ 4 , 8 ] seed = 3"]);
    }

    #[test]
    fn holes_are_sentinels() {
        let mut holes = Vec::new();
        let stmts = statements("%y = mul %x, {lr}; %z = full f32[{n}] -{v}".parse().unwrap(), &mut holes, |_| None);
        assert_eq!(holes.len(), 3);
        assert!(stmts[1].as_ref().ok().unwrap().text.contains(&sentinel(1).to_string()));
        for k in 0..3 {
            let s = sentinel(k);
            assert_eq!(hole_of(s, 3), Some((k, false)));
            assert_eq!(hole_of(-s, 3), Some((k, true)));
            assert_eq!((s as f32) as i128, s, "exact as f32");
            assert_eq!((s as f64) as i128, s, "exact as f64");
        }
        assert_eq!(hole_of(sentinel(3), 3), None);
        assert_eq!(hole_of(sentinel(0) + 1, 3), None);
        assert_eq!(hole_of(7, 3), None);
    }

    #[test]
    fn bad_tokens_are_errors() {
        for src in ["%y = mul %x, (1)", "%y = mul %x, {}", "%0 = relu %x", "%y = relu %", "%y = tensor f32[2] [1; 2]"] {
            let mut holes = Vec::new();
            let stmts = statements(src.parse().unwrap(), &mut holes, |_| None);
            assert!(matches!(stmts.as_slice(), [Err(_)]), "{src}");
        }
    }
}
