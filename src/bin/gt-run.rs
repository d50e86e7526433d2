//! `gt-run`: runs a `.gtir` script: prints what it prints, checks its expectations. By
//! default on an embedded cluster (a dispatcher and `GT_WORKERS` workers in this process);
//! `--connect HOST:PORT` runs it on a `gt server`; `--reference` on the bare interpreter.
//! Exit codes: 0 success, 1 runtime error or failed expectation, 2 usage, parse or type error.

#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

use clap::Parser;
use gt::diagnostics::{render, Diag};
use gt::frontend::RunOptions;
use gt::passes::registry::in_pipeline_order;
use gt::runtime::config::EnvConfig;
use gt::runtime::embedded::ClusterError;
use gt::script::{load, run_any, run_local, run_on, run_training, source_text, LoadError};
use gt::session::PassDumps;
use gt::session::{format_pass_stats, format_worker_stats, Session, Target};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// What `--dump-after` can name: `parse`, `verify`, a pass, or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The program as parsed.
    Parse,
    /// The verified program, each result annotated with its type.
    Verify,
    /// The instruction stream after a pass.
    Pass(&'static str),
    /// Every stage, and every pass that runs.
    All,
}

fn stage(s: &str) -> Result<Stage, String> {
    match s {
        "parse" => Ok(Stage::Parse),
        "verify" => Ok(Stage::Verify),
        "all" => Ok(Stage::All),
        _ => gt::passes::registry::check(s)
            .map(Stage::Pass)
            .map_err(|_| format!("expected parse, verify, all or a pass ({})", gt::passes::KNOWN_PASSES.join(", "))),
    }
}

/// Run a gt tensor program written in `.gtir`.
#[derive(Debug, Parser)]
#[command(name = "gt-run", version)]
struct Args {
    /// The script to run.
    script: PathBuf,
    /// Print the program as `.gtir` text after this stage: parse, verify, a pass (which is
    /// then switched on; the stream is printed as the dispatcher's passes see it), or all
    /// (repeatable).
    #[arg(long = "dump-after", value_name = "STAGE", value_parser = stage)]
    dump_after: Vec<Stage>,
    /// Print the counters of the passes on this script's stream after the run (to stderr).
    #[arg(long)]
    pass_stats: bool,
    /// Do not print values; only errors (expectations are still checked).
    #[arg(short, long)]
    quiet: bool,
    /// Keep every value until the end (by default a value is freed after its last use).
    #[arg(long)]
    keep_values: bool,
    /// Run the script as a filetest: check its `; test`, `; out:` and `; error:` lines.
    #[arg(long)]
    test: bool,
    /// Run on the dispatcher at HOST:PORT (a `gt server`) instead of in this process.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["workers", "reference"])]
    connect: Option<String>,
    /// The cluster key file (`gt keygen`) for a dispatcher reached over TCP (as GT_KEY_FILE).
    #[arg(long, value_name = "FILE", requires = "connect")]
    key: Option<PathBuf>,
    /// Embedded workers to start, 1 to 256 (default: GT_WORKERS, else 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=gt::runtime::config::MAX_WORKERS as i64))]
    workers: Option<u16>,
    /// Run on the reference interpreter in this thread (no dispatcher, no workers).
    #[arg(long, conflicts_with = "workers")]
    reference: bool,
    /// Print every worker's per-op counts and times after the run (to stderr).
    #[arg(long)]
    worker_stats: bool,
    /// Write the kernels the script's instructions lower to into DIR: per kernel its kernel
    /// IR (`NNN-KIND.kernel`) and generated PTX (`NNN-KIND.ptx`).
    #[arg(long, value_name = "DIR")]
    dump_kernels: Option<PathBuf>,
    /// Profile the run into DIR (as `GT_PROFILE=DIR`): every executed kernel, copy and
    /// transfer with its script line, signal, shapes, bytes, FLOPs and times, one CSV per
    /// worker plus a manifest; `gt prof report DIR` draws it. A remote dispatcher profiles
    /// when it was started with `GT_PROFILE`.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["connect", "reference"])]
    profile: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    gt::logging::init("error");
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
    // A bad signal config is refused at start, naming its line and field.
    if let Err(e) = gt::init::load_signal_config() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let source = source_text(&bytes);
    let report = |diags: &[Diag]| eprint!("{}", render(&name, &source, diags, color));
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
    let options = RunOptions { quiet: args.quiet, keep_values: args.keep_values };
    let result = if args.reference {
        run_local(&loaded, &mut out, options)
    } else {
        match run_on_cluster(&args, (&name, &source), &loaded, &mut out, options) {
            Ok(r) => r,
            Err(code) => return code,
        }
    };
    let _ = out.flush();
    if let Some(dir) = &args.dump_kernels {
        // The kernels do not depend on where the script ran: record them on the interpreter.
        let quiet = RunOptions { quiet: true, ..RunOptions::default() };
        let (_, recorder) = run_any(&loaded, gt::kernels::KernelRecorder::new(), &mut std::io::sink(), quiet);
        let recorder = recorder.unwrap_or_default();
        match recorder.write(dir) {
            Ok(n) => eprintln!("gt-run: wrote {n} kernels to {}", dir.display()),
            Err(e) => {
                eprintln!("error: cannot write kernels to {}: {e:#}", dir.display());
                return ExitCode::from(2);
            }
        }
    }
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            report(&[Diag::from(&e)]);
            ExitCode::from(1)
        }
    }
}

/// Runs the script on an embedded cluster or a remote dispatcher (`--connect`), printing
/// statistics and pass dumps as asked; `Err` is the exit code of a failure to start.
fn run_on_cluster(
    args: &Args,
    (name, source): (&str, &str),
    loaded: &gt::script::Loaded,
    out: &mut impl Write,
    options: RunOptions,
) -> Result<Result<gt::frontend::RunSummary, gt::frontend::ScriptError>, ExitCode> {
    let target = match &args.connect {
        Some(address) => Target::Remote(address.clone()),
        None => Target::Embedded { workers: args.workers.map(usize::from) },
    };
    let mut env = match EnvConfig::from_env() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(ExitCode::from(1));
        }
    };
    if let Some(dir) = &args.profile {
        env.profile = Some(dir.clone());
    }
    if let Some(file) = &args.key {
        env.key_file = Some(file.clone());
    }
    // Passes named by --dump-after run (in an embedded cluster) and are dumped.
    let mut dumped: Vec<&'static str> =
        args.dump_after.iter().filter_map(|s| if let Stage::Pass(p) = s { Some(*p) } else { None }).collect();
    if args.dump_after.contains(&Stage::All) {
        dumped.extend(env.passes.iter().copied());
    }
    in_pipeline_order(&mut dumped);
    env.enable_passes(&dumped);
    // The dumps are the dispatcher's own (`GT_DUMP_PASSES`), into a private directory.
    let pass_dumps = if dumped.is_empty() {
        None
    } else {
        match PassDumps::start(&target, &mut env) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("error: --dump-after: {e:#}");
                return Err(ExitCode::from(2));
            }
        }
    };
    let mut session = match Session::open_with(&target, &format!("gt-run {name}"), &env) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            // No GPU for GT_BACKEND=cuda: nothing to run on, like a missing dispatcher.
            let no_backend = matches!(e.downcast_ref(), Some(ClusterError::Backend(_)));
            return Err(ExitCode::from(if no_backend { 2 } else { 1 }));
        }
    };
    // Batches say each instruction's script line (profiles report them).
    session.client.set_source(source);
    let result = if loaded.program.trains() {
        // Autograd lives in the client: the script runs through the Tensor API, which
        // owns the client meanwhile.
        let (client, cluster) = session.into_parts();
        let (result, client) = run_training(loaded, client, out, options);
        let Some(client) = client else {
            eprintln!("error: the client was lost while training");
            return Err(ExitCode::from(1));
        };
        session = Session::from_parts(client, cluster);
        result
    } else {
        run_on(loaded, &mut session.client, out, options)
    };
    if args.worker_stats || args.pass_stats {
        match session.client.stats() {
            Ok((workers, passes)) => {
                if args.worker_stats {
                    eprint!("{}", format_worker_stats(&workers));
                }
                if args.pass_stats {
                    eprint!("{}", format_pass_stats(&passes));
                }
            }
            Err(e) => eprintln!("error: cannot read statistics: {e}"),
        }
    }
    // The dispatcher writes its dumps until the session ends.
    let client_id = session.client.id();
    drop(session);
    if let Some(d) = pass_dumps {
        match d.read(client_id, &dumped) {
            Ok(texts) => {
                for (pass, text) in texts {
                    let _ = write!(out, "; after {pass}\n{text}");
                }
            }
            Err(e) => eprintln!("error: --dump-after: {e:#}"),
        }
    }
    Ok(result)
}
