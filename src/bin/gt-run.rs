//! `gt-run`: runs a `.gtir` script: prints what it prints, checks its expectations.
//! Exit codes: 0 success, 1 runtime error or failed expectation, 2 usage, parse or type error.

use clap::{Parser, ValueEnum};
use gt::diagnostics::{render, Diag};
use gt::frontend::RunOptions;
use gt::script::{load, run_local, source_text, LoadError};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Stages whose output `--dump-after` can print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Stage {
    /// The program as parsed.
    Parse,
    /// The verified program, each result annotated with its type.
    Verify,
    /// Every stage.
    All,
}

/// Run a gt tensor program written in `.gtir`.
#[derive(Debug, Parser)]
#[command(name = "gt-run", version)]
struct Args {
    /// The script to run.
    script: PathBuf,
    /// Print the program as `.gtir` text after this stage (repeatable).
    #[arg(long = "dump-after", value_name = "STAGE")]
    dump_after: Vec<Stage>,
    /// Do not print values; only errors (expectations are still checked).
    #[arg(short, long)]
    quiet: bool,
    /// Run the script as a filetest: check its `; test`, `; out:` and `; error:` lines.
    #[arg(long)]
    test: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let color = std::io::stderr().is_terminal();
    let name = args.script.display().to_string();
    if args.test {
        return match gt::filetest::run_file(&args.script) {
            Ok(_) => {
                println!("ok {name}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("FAILED {name}: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    let bytes = match std::fs::read(&args.script) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot read {name}: {e}");
            return ExitCode::from(2);
        }
    };
    let report = |diags: &[Diag]| eprint!("{}", render(&name, &source_text(&bytes), diags, color));
    let dumps = |stage: Stage| args.dump_after.iter().any(|s| *s == stage || *s == Stage::All);
    let loaded = match load(&bytes) {
        Ok(l) => l,
        Err(e) => {
            if let LoadError::Verify { program, .. } = &e {
                if dumps(Stage::Parse) {
                    print!("; after parse\n{}", gt::ir::text::print(program));
                }
            }
            report(&e.diags());
            return ExitCode::from(2);
        }
    };
    if dumps(Stage::Parse) {
        print!("; after parse\n{}", gt::ir::text::print(&loaded.program));
    }
    if dumps(Stage::Verify) {
        print!("; after verify\n{}", gt::ir::text::print_with_types(&loaded.program, &loaded.types));
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = run_local(&loaded, &mut out, RunOptions { quiet: args.quiet });
    let _ = out.flush();
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            report(&[Diag::from(&e)]);
            ExitCode::from(1)
        }
    }
}
