//! The `.gtir` filetest runner, shared by `cargo test` (tests/it/filetests.rs) and
//! `gt-run --test FILE`. A filetest is a program plus its expectations in comments:
//!
//! - `; test print`: the program parses, and printing then parsing gives it back.
//! - `; test verify`: each `; error: TEXT` must match a diagnostic (on its own line when
//!   it trails code), and every diagnostic must be expected. No `; error:` = must verify.
//! - `; test run`: runs on the reference interpreter (or any runner: the cluster test runs
//!   them on an embedded dispatcher and workers); `expect` lines must hold, stdout must
//!   equal the `; out: LINE` lines; with `; error:` lines the run must fail that way.
//!
//! [`run_source`] returns the text that goes to the insta snapshot: the printed program
//! (with types when it verified) and the rendered diagnostics.

use crate::diagnostics::{line_col, render, Diag};
use crate::script::{load, run_local, source_text, Loaded};
use anyhow::{anyhow, bail, Context, Result};
use gt_frontend::{RunOptions, RunSummary, ScriptError};
use gt_ir::text;
use std::io::Write;
use std::path::Path;

/// A filetest command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Parse and round-trip through the printer.
    Print,
    /// Check diagnostics.
    Verify,
    /// Run and check output and expectations.
    Run,
}

/// An expected error: a message fragment, tied to a line when it trails code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedError {
    /// 1-based line, when the directive trails code.
    pub line: Option<usize>,
    /// Fragment the message must contain.
    pub text: String,
}

/// The directives of a filetest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    /// `; test` commands, in order.
    pub commands: Vec<Command>,
    /// `; error:` lines.
    pub errors: Vec<ExpectedError>,
    /// `; out:` lines.
    pub out: Vec<String>,
}

/// Reads the directives from a file's text.
pub fn directives(source: &str) -> Result<Directives> {
    let mut d = Directives::default();
    for (i, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(cmd) = trimmed.strip_prefix("; test ") {
            d.commands.push(match cmd.trim() {
                "print" => Command::Print,
                "verify" => Command::Verify,
                "run" => Command::Run,
                other => bail!("line {}: unknown test command `{other}` (known: print, verify, run)", i + 1),
            });
        } else if let Some(rest) = trimmed.strip_prefix("; out:") {
            d.out.push(rest.strip_prefix(' ').unwrap_or(rest).to_string());
        } else if let Some(at) = line.find("; error:") {
            let code = line[..at].trim();
            d.errors.push(ExpectedError {
                line: (!code.is_empty()).then_some(i + 1),
                text: line[at + "; error:".len()..].trim().to_string(),
            });
        }
    }
    if d.commands.is_empty() {
        bail!("no `; test` line (use `; test print`, `; test verify` or `; test run`)");
    }
    Ok(d)
}

/// Runs a loaded program for `; test run`, writing what it prints.
pub type Runner<'a> = dyn FnMut(&Loaded, &mut dyn Write) -> Result<RunSummary, ScriptError> + 'a;

/// Every `.gtir` file under `dir` (recursively), sorted.
pub fn gtir_files(dir: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "gtir") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files.sort();
    files
}

/// The run filetests (`tests/gtir/run`) and examples (`examples/`) under `root`, sorted:
/// every script a backend must run like the interpreter.
pub fn run_scripts(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = gtir_files(&root.join("examples"));
    files.extend(gtir_files(&root.join("tests/gtir/run")));
    files
}

/// Runs a filetest file on the reference interpreter; returns its snapshot text.
pub fn run_file(path: &Path) -> Result<String> {
    run_file_on(path, &mut |loaded, out| run_local(loaded, out, RunOptions::default()))
}

/// Runs a filetest file, its `; test run` on `runner`; returns its snapshot text.
pub fn run_file_on(path: &Path, runner: &mut Runner<'_>) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    run_source_on(&name, &bytes, runner)
}

/// Runs a filetest from its bytes on the reference interpreter; returns its snapshot text.
pub fn run_source(name: &str, bytes: &[u8]) -> Result<String> {
    run_source_on(name, bytes, &mut |loaded, out| run_local(loaded, out, RunOptions::default()))
}

/// Runs a filetest from its bytes, its `; test run` on `runner`; returns its snapshot text.
pub fn run_source_on(name: &str, bytes: &[u8], runner: &mut Runner<'_>) -> Result<String> {
    let source = source_text(bytes);
    let d = directives(&source)?;
    let mut snapshot = String::new();
    for cmd in &d.commands {
        match cmd {
            Command::Print => snapshot.push_str(&check_print(bytes)?),
            Command::Verify => snapshot.push_str(&check_verify(name, bytes, &source, &d)?),
            Command::Run => snapshot.push_str(&check_run(name, bytes, &source, &d, runner)?),
        }
    }
    Ok(snapshot)
}

fn check_print(bytes: &[u8]) -> Result<String> {
    let program = text::parse_bytes(bytes).map_err(|e| anyhow!("parse error: {e}"))?;
    let printed = text::print(&program);
    let back = text::parse(&printed).map_err(|e| anyhow!("printed text does not parse: {e}\n{printed}"))?;
    // Printed forms, not `==`: a `nan` literal is never equal to itself.
    if text::print(&back) != printed {
        bail!("printing and parsing changed the program; printed:\n{printed}");
    }
    Ok(format!("; print\n{printed}"))
}

/// Checks that every expected error matches a diagnostic and every diagnostic is expected.
fn match_errors(source: &str, expected: &[ExpectedError], found: &[Diag]) -> Result<()> {
    let line_of = |d: &Diag| line_col(source, d.span.start as usize).0;
    let fits = |e: &ExpectedError, d: &Diag| d.message.contains(&e.text) && e.line.is_none_or(|l| l == line_of(d));
    for e in expected {
        if !found.iter().any(|d| fits(e, d)) {
            let got: Vec<String> = found.iter().map(|d| format!("line {}: {}", line_of(d), d.message)).collect();
            bail!(
                "expected error {:?}{} not reported; reported:\n  {}",
                e.text,
                e.line.map(|l| format!(" on line {l}")).unwrap_or_default(),
                if got.is_empty() { "nothing".to_string() } else { got.join("\n  ") }
            );
        }
    }
    for d in found {
        if !expected.iter().any(|e| fits(e, d)) {
            bail!("unexpected error on line {}: {}", line_of(d), d.message);
        }
    }
    Ok(())
}

fn check_verify(name: &str, bytes: &[u8], source: &str, d: &Directives) -> Result<String> {
    match load(bytes) {
        Ok(loaded) => {
            match_errors(source, &d.errors, &[])?;
            Ok(format!("; verify\n{}", text::print_with_types(&loaded.program, &loaded.types)))
        }
        Err(e) => {
            let diags = e.diags();
            match_errors(source, &d.errors, &diags)?;
            Ok(format!("; verify\n{}", render(name, source, &diags, false)))
        }
    }
}

fn check_run(name: &str, bytes: &[u8], source: &str, d: &Directives, runner: &mut Runner<'_>) -> Result<String> {
    let loaded = load(bytes).map_err(|e| anyhow!("does not load:\n{}", render(name, source, &e.diags(), false)))?;
    let mut out = Vec::new();
    let result = runner(&loaded, &mut out);
    let stdout = String::from_utf8_lossy(&out);
    match result {
        Ok(_) if !d.errors.is_empty() => bail!("run succeeded, but errors were expected: {:?}", d.errors),
        Ok(_) => {}
        Err(e) => {
            if d.errors.is_empty() {
                bail!("run failed:\n{}", render(name, source, &[Diag::from(&e)], false));
            }
            match_errors(source, &d.errors, &[Diag::from(&e)])?;
        }
    }
    let expected: String = d.out.iter().map(|l| format!("{l}\n")).collect();
    if stdout != expected {
        bail!("stdout differs.\n--- expected\n{expected}--- found\n{stdout}");
    }
    Ok(format!("; run\n{}", text::print_with_types(&loaded.program, &loaded.types)))
}
