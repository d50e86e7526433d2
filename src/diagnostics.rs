//! Rendering of parse, verify and script errors as source snippets (codespan-reporting).
//! Libraries return typed errors with spans; only this module turns them into text.

use codespan_reporting::diagnostic::{Diagnostic, Label};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, termcolor};
use gt_frontend::ScriptError;
use gt_ir::text::ParseError;
use gt_ir::{Span, VerifyError};

/// Lines longer than this are shown clipped around the error.
const MAX_SHOWN_LINE: usize = 240;
/// Bytes of context kept on each side of the error in a clipped line.
const CLIP_CONTEXT: usize = 60;

/// One error to show: a message, the place, optionally a related place, and notes.
#[derive(Debug, Clone, PartialEq)]
pub struct Diag {
    /// The headline.
    pub message: String,
    /// Where.
    pub span: Span,
    /// A second place and what it is.
    pub related: Option<(Span, String)>,
    /// `help:` and `note:` lines.
    pub notes: Vec<String>,
}

impl From<&ParseError> for Diag {
    fn from(e: &ParseError) -> Diag {
        Diag {
            message: e.to_string(),
            span: e.span,
            related: None,
            notes: e.help().map(|h| format!("help: {h}")).into_iter().collect(),
        }
    }
}

impl From<&VerifyError> for Diag {
    fn from(e: &VerifyError) -> Diag {
        Diag {
            message: e.to_string(),
            span: e.span,
            related: e.related().map(|(s, m)| (s, m.to_string())),
            notes: vec![],
        }
    }
}

impl From<&ScriptError> for Diag {
    fn from(e: &ScriptError) -> Diag {
        let related = e.reported_at.map(|at| (at, "reported at this sync point".to_string()));
        Diag { message: e.to_string(), span: e.span, related, notes: vec![] }
    }
}

/// 1-based line and column of a byte offset.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = offset - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Renders diagnostics against the source, with or without terminal colours.
pub fn render(file_name: &str, source: &str, diags: &[Diag], color: bool) -> String {
    let mut out = String::new();
    for d in diags {
        out.push_str(&render_one(file_name, source, d, color));
    }
    out
}

fn render_one(file_name: &str, source: &str, d: &Diag, color: bool) -> String {
    let mut d = d.clone();
    let clipped;
    let mut shown = source;
    let start = (d.span.start as usize).min(source.len());
    let line_start = source[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = source[start..].find('\n').map_or(source.len(), |i| start + i);
    if line_end - line_start > MAX_SHOWN_LINE {
        // A huge line would drown the message: show a window around the error instead.
        let (line, col) = line_col(source, start);
        let lo = floor_char(source, start.saturating_sub(CLIP_CONTEXT).max(line_start));
        // A span may cover the whole huge line (a statement); show only its beginning.
        let end = (d.span.end as usize).clamp(start, line_end).min(start + 2 * CLIP_CONTEXT);
        let hi = ceil_char(source, (end.max(start + 1) + CLIP_CONTEXT).min(line_end));
        let prefix = "\n".repeat(line - 1);
        clipped = format!("{prefix}…{}…", &source[lo..hi]);
        let base = prefix.len() + '…'.len_utf8();
        d.span = gt_ir::Span::new(base + start - lo, base + end.min(hi) - lo);
        d.related = None;
        d.notes.push(format!(
            "note: line {line} is {} bytes long; showing bytes {}..{} of it (the error is at column {col})",
            line_end - line_start,
            lo - line_start,
            hi - line_start
        ));
        shown = &clipped;
    }
    let file = SimpleFile::new(file_name, shown);
    let mut labels = vec![Label::primary((), clamp(d.span, shown))];
    if let Some((span, msg)) = &d.related {
        labels.push(Label::secondary((), clamp(*span, shown)).with_message(msg.clone()));
    }
    let diagnostic = Diagnostic::error().with_message(&d.message).with_labels(labels).with_notes(d.notes.clone());
    let config = term::Config::default();
    let mut bytes = Vec::new();
    let emitted = if color {
        term::emit(&mut termcolor::Ansi::new(&mut bytes), &config, &file, &diagnostic)
    } else {
        term::emit(&mut termcolor::NoColor::new(&mut bytes), &config, &file, &diagnostic)
    };
    if emitted.is_err() {
        let (line, col) = line_col(source, start);
        return format!("error: {}\n  --> {file_name}:{line}:{col}\n", d.message);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn clamp(span: Span, source: &str) -> std::ops::Range<usize> {
    let s = floor_char(source, (span.start as usize).min(source.len()));
    let e = ceil_char(source, (span.end as usize).clamp(s, source.len()));
    s..e
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_lines_are_clipped_around_the_error() {
        let mut src = "%x = tensor f32[3] [".to_string();
        src.push_str(&"1, ".repeat(100_000));
        let at = src.len();
        src.push_str("oops]\n");
        let d = Diag { message: "boom".into(), span: Span::new(at, at + 4), related: None, notes: vec![] };
        let text = render("big.gtir", &src, &[d], false);
        assert!(text.len() < 2_000, "rendered {} bytes", text.len());
        assert!(text.contains("oops"));
        let line_len = src.len() - 1;
        assert!(text.contains(&format!("line 1 is {line_len} bytes long")), "{text}");
    }

    #[test]
    fn line_col_is_one_based() {
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("", 0), (1, 1));
    }
}
