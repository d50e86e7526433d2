//! `gt`: the distributed runtime's processes and the tools that watch them (`gt server`,
//! `gt worker`, `gt keygen`, `gt top`, `gt trace`, `gt visualize`, `gt perfetto`, `gt prof`).
//! The command line lives in the library, `gt::cli`, so that the Python package runs the same
//! code; this binary only hands it the process's arguments.
//! Exit codes: 0 clean stop, 1 runtime failure, 2 usage error, bad input or nothing to run on.

#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(gt::cli::run(std::env::args_os()))
}
