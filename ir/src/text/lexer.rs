//! The `.gtir` lexer: bytes to tokens with spans. Comments (`;` to end of line) are
//! skipped; newlines are tokens because they end statements.

use super::{ParseError, ParseErrorKind};
use crate::Span;

/// A token's kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// `%name`: a value (the name without `%`).
    Value(String),
    /// A bare word: op names, keywords, dtypes, attribute and constant names.
    Ident(String),
    /// A number literal, kept as written so that each use parses it at its own type.
    Number(String),
    /// A string literal, unescaped.
    Str(String),
    /// `=`
    Eq,
    /// `==`
    EqEq,
    /// `~=`
    Approx,
    /// `,`
    Comma,
    /// `:`
    Colon,
    /// `-`
    Minus,
    /// `[`
    LBracket,
    /// `]`
    RBracket,
    /// `{`
    LBrace,
    /// `}`
    RBrace,
    /// `...`
    Ellipsis,
    /// A `fused` instruction's kernel, verbatim from `kernel` to its closing `}` (lines
    /// included): the kernel IR's own text form, read by `kernel::text::parse`.
    Kernel(String),
    /// End of a line.
    Newline,
    /// End of input.
    Eof,
}

impl Tok {
    /// How the token reads in a message.
    pub fn describe(&self) -> String {
        match self {
            Tok::Value(n) => format!("value `%{n}`"),
            Tok::Ident(n) => format!("`{n}`"),
            Tok::Number(n) => format!("number `{n}`"),
            Tok::Str(_) => "a string".into(),
            Tok::Eq => "`=`".into(),
            Tok::EqEq => "`==`".into(),
            Tok::Approx => "`~=`".into(),
            Tok::Comma => "`,`".into(),
            Tok::Colon => "`:`".into(),
            Tok::Minus => "`-`".into(),
            Tok::LBracket => "`[`".into(),
            Tok::RBracket => "`]`".into(),
            Tok::LBrace => "`{`".into(),
            Tok::RBrace => "`}`".into(),
            Tok::Ellipsis => "`...`".into(),
            Tok::Kernel(_) => "a kernel".into(),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of file".into(),
        }
    }
}

/// Splits source text into tokens; the last is always [`Tok::Eof`].
pub fn lex(src: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let err = |start: usize, end: usize, kind| ParseError { span: Span::new(start, end), kind };
    // On a line of a `fused` instruction, `kernel` starts the kernel's own text form, which
    // has tokens of its own (`+0`, `%0 = load in0`) and spans lines: it is taken verbatim.
    let mut fused_line = false;
    let mut brackets = 0usize;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let simple = match c {
            b'\n' => Some(Tok::Newline),
            b',' => Some(Tok::Comma),
            b':' => Some(Tok::Colon),
            b'-' => Some(Tok::Minus),
            b'[' => Some(Tok::LBracket),
            b']' => Some(Tok::RBracket),
            b'{' => Some(Tok::LBrace),
            b'}' => Some(Tok::RBrace),
            _ => None,
        };
        if let Some(t) = simple {
            // A newline inside brackets does not end the statement (the parser skips it).
            match t {
                Tok::LBracket => brackets += 1,
                Tok::RBracket => brackets = brackets.saturating_sub(1),
                Tok::Newline if brackets == 0 => fused_line = false,
                _ => {}
            }
            i += 1;
            out.push((t, Span::new(start, i)));
            continue;
        }
        match c {
            b' ' | b'\t' | b'\r' => i += 1,
            b';' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'=' => {
                let (t, n) = if bytes.get(i + 1) == Some(&b'=') { (Tok::EqEq, 2) } else { (Tok::Eq, 1) };
                i += n;
                out.push((t, Span::new(start, i)));
            }
            b'~' if bytes.get(i + 1) == Some(&b'=') => {
                i += 2;
                out.push((Tok::Approx, Span::new(start, i)));
            }
            b'.' if bytes.get(i + 1) == Some(&b'.') && bytes.get(i + 2) == Some(&b'.') => {
                i += 3;
                out.push((Tok::Ellipsis, Span::new(start, i)));
            }
            b'%' => {
                i += 1;
                while i < bytes.len() && is_word(bytes[i]) {
                    i += 1;
                }
                if i == start + 1 {
                    return Err(err(start, i, ParseErrorKind::EmptyValueName));
                }
                out.push((Tok::Value(src[start + 1..i].to_string()), Span::new(start, i)));
            }
            b'"' => {
                i += 1;
                let mut s = String::new();
                loop {
                    match bytes.get(i) {
                        None | Some(b'\n') => return Err(err(start, i, ParseErrorKind::UnterminatedString)),
                        Some(b'"') => {
                            i += 1;
                            break;
                        }
                        Some(b'\\') => {
                            match bytes.get(i + 1) {
                                Some(b'"') => s.push('"'),
                                Some(b'\\') => s.push('\\'),
                                Some(b'n') => s.push('\n'),
                                _ => return Err(err(i, i + 2, ParseErrorKind::BadEscape)),
                            }
                            i += 2;
                        }
                        Some(_) => {
                            // Copy one whole UTF-8 character.
                            let ch = src[i..].chars().next().unwrap_or('\u{fffd}');
                            s.push(ch);
                            i += ch.len_utf8();
                        }
                    }
                }
                out.push((Tok::Str(s), Span::new(start, i)));
            }
            b'0'..=b'9' | b'.' => {
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                if bytes.get(i) == Some(&b'.') && bytes.get(i + 1) != Some(&b'.') {
                    i += 1;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                if matches!(bytes.get(i), Some(b'e' | b'E')) {
                    let mut j = i + 1;
                    if matches!(bytes.get(j), Some(b'+' | b'-')) {
                        j += 1;
                    }
                    if bytes.get(j).is_some_and(|b| b.is_ascii_digit()) {
                        i = j;
                        while i < bytes.len() && bytes[i].is_ascii_digit() {
                            i += 1;
                        }
                    }
                }
                // A number glued to letters (`12ab`) is a typo, not two tokens; a lone `.` or
                // `..` has no digit and must not become an empty token.
                let has_digit = src[start..i].bytes().any(|b| b.is_ascii_digit());
                if !has_digit || i < bytes.len() && is_word(bytes[i]) {
                    i = i.max(start + 1);
                    while i < bytes.len() && is_word(bytes[i]) {
                        i += 1;
                    }
                    return Err(err(start, i, ParseErrorKind::BadNumber { text: src[start..i].to_string() }));
                }
                out.push((Tok::Number(src[start..i].to_string()), Span::new(start, i)));
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < bytes.len() && is_word(bytes[i]) {
                    i += 1;
                }
                let word = &src[start..i];
                if word == "kernel" && fused_line {
                    i = kernel_end(bytes, i).ok_or_else(|| err(start, i, ParseErrorKind::UnterminatedKernel))?;
                    out.push((Tok::Kernel(blank_comments(&src[start..i])), Span::new(start, i)));
                    continue;
                }
                fused_line |= word == "fused";
                out.push((Tok::Ident(word.to_string()), Span::new(start, i)));
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('\u{fffd}');
                return Err(err(start, start + ch.len_utf8(), ParseErrorKind::UnexpectedChar { ch }));
            }
        }
    }
    out.push((Tok::Eof, Span::new(bytes.len(), bytes.len())));
    Ok(out)
}

/// The end (exclusive) of a kernel's text starting before `from`: just past the `}` that
/// closes its first `{` (braces in comments aside), or `None` when the input ends first.
fn kernel_end(bytes: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut comment = false;
    for (j, &b) in bytes.iter().enumerate().skip(from) {
        match b {
            b'\n' => comment = false,
            _ if comment => {}
            b';' => comment = true,
            b'{' => depth += 1,
            b'}' if depth <= 1 => return (depth == 1).then_some(j + 1),
            b'}' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Kernel text with its `;` comments replaced by spaces (offsets, hence line and column
/// numbers, stay those of the source).
fn blank_comments(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| match line.find(';') {
            Some(c) => {
                let end = line.trim_end_matches(['\n', '\r']).len();
                format!("{}{}{}", &line[..c], " ".repeat(end - c), &line[end..])
            }
            None => line.to_string(),
        })
        .collect()
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}
