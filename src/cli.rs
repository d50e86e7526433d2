//! The `gt` command line as a library: `run` parses the arguments and runs `gt server`,
//! `gt worker`, the tools and `gt keygen`, so that the `gt` binary (`src/bin/gt.rs`) and the
//! Python package run the same code. `gt server -p PORT` runs a dispatcher that clients
//! (`gt-run --connect HOST:PORT`) and workers (`gt worker --host HOST -p PORT`) join;
//! `gt visualize`, `gt perfetto`, `gt top` and `gt trace` read its events, `gt prof` its
//! profiles (`gt_tools`; each subcommand here only parses arguments and reports). `gt keygen`
//! writes the cluster key that lets members in over TCP (`gt_transport::auth`).
//! Exit codes: 0 clean stop, 1 runtime failure, 2 usage error, bad input or nothing to run on.

use crate::runtime::backend::BackendKind;
use crate::runtime::config::EnvConfig;
use crate::runtime::embedded::{Cluster, ClusterError, ClusterOptions};
use crate::runtime::worker::{run_worker_reconnecting, WorkerError, WorkerOptions};
use crate::transport::{ClusterKey, Endpoint};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod prof;

/// gt's distributed runtime: a dispatcher and workers in separate processes.
#[derive(Debug, Parser)]
#[command(name = "gt", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a dispatcher: clients and workers connect to it.
    Server {
        /// TCP port (an IPC socket for this machine's peers is made beside it). Not 0:
        /// workers and clients elsewhere must know it.
        #[arg(short, long, default_value_t = 9000, value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
        /// Address to listen on: 127.0.0.1 (this machine only) or 0.0.0.0 (every interface).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Worker threads to start inside the server too (at most 256).
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=crate::runtime::config::MAX_WORKERS as i64))]
        workers: u16,
        /// TCP port of the monitor socket (`gt top`, `gt trace`) when listening beyond this
        /// machine (default: PORT + 1); this machine's tools use an IPC socket.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        monitor_port: Option<u16>,
        /// The cluster key file (`gt keygen`; default: GT_KEY_FILE): TCP is encrypted and
        /// only workers and clients holding the same file get in.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
        /// Listen beyond the loopback (--host 0.0.0.0) without a key: anyone who reaches the
        /// port can run work and read data (as GT_INSECURE=1).
        #[arg(long)]
        insecure: bool,
    },
    /// Write a new cluster key file: give it to the server, every worker and every client
    /// (`--key FILE` or GT_KEY_FILE=FILE).
    Keygen {
        /// Where to write it (default: $XDG_CONFIG_HOME/gt/cluster.key, else
        /// ~/.config/gt/cluster.key).
        path: Option<PathBuf>,
        /// Replace an existing file (members holding the old key are locked out).
        #[arg(long)]
        force: bool,
    },
    /// Run a worker for the dispatcher at HOST:PORT.
    Worker {
        /// The dispatcher's host (IPC is used when it is this machine).
        #[arg(long, default_value = "localhost")]
        host: String,
        /// The dispatcher's port.
        #[arg(short, long, default_value_t = 9000)]
        port: u16,
        /// The worker's name in logs and statistics (default: worker@HOSTNAME-PID).
        #[arg(long)]
        name: Option<String>,
        /// What executes the stream: cpu, or cuda (an NVIDIA GPU; needs a build with
        /// `--features cuda`).
        #[arg(long, default_value = "cpu")]
        backend: BackendKind,
        /// Seconds to wait for the dispatcher to answer the registration.
        #[arg(long, default_value_t = 10)]
        wait: u64,
        /// Seconds to keep trying to register again when the dispatcher goes away (it was
        /// restarted, or paused past the heartbeat timeout); 0: exit at once.
        #[arg(long, default_value_t = 30)]
        reconnect: u64,
        /// Compute threads for large work (matrix products) on a CPU worker (default:
        /// GT_THREADS, else every core).
        #[arg(long)]
        threads: Option<usize>,
        /// The dispatcher's address as an endpoint (`tcp://HOST:PORT` takes TCP even on this
        /// machine, `ipc:///PATH`), instead of --host and -p.
        #[arg(long, value_name = "ENDPOINT", conflicts_with_all = ["host", "port"])]
        connect: Option<String>,
        /// The cluster key file (`gt keygen`; default: GT_KEY_FILE), for a dispatcher reached
        /// over TCP.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
    /// Watch a running dispatcher live: per worker its activity by op, idle share,
    /// instructions/s, bytes/s and memory; per client its queue (`q` quits).
    Top {
        /// The dispatcher's host (another machine: its monitor at PORT + 1 over TCP).
        #[arg(long, default_value = "localhost")]
        host: String,
        /// The dispatcher's port (default: the newest dispatcher running on this machine).
        #[arg(short, long)]
        port: Option<u16>,
        /// Smoothing of the activity bars (0 < alpha <= 1; higher follows faster).
        #[arg(long, default_value_t = 0.15)]
        ema_alpha: f64,
        /// The cluster key file (`gt keygen`; default: GT_KEY_FILE), for another machine's
        /// dispatcher.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
    /// Capture a running dispatcher's events into a log that `gt visualize` and
    /// `gt perfetto` read.
    Trace {
        /// How long to listen, in seconds.
        #[arg(short, long, default_value_t = 5.0)]
        seconds: f64,
        /// Stop after this many events.
        #[arg(short = 'n', long)]
        max_events: Option<usize>,
        /// The dispatcher's host (another machine: its monitor at PORT + 1 over TCP).
        #[arg(long, default_value = "localhost")]
        host: String,
        /// The dispatcher's port (default: the newest dispatcher running on this machine).
        #[arg(short, long)]
        port: Option<u16>,
        /// The directory for the log (created if missing).
        #[arg(long, default_value = ".")]
        dir: std::path::PathBuf,
        /// The log's file name (default: trace_YYYYMMDD_HHMMSS.log).
        #[arg(short, long)]
        output: Option<std::path::PathBuf>,
        /// The cluster key file (`gt keygen`; default: GT_KEY_FILE), for another machine's
        /// dispatcher.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
    /// Draw an instruction log (gt's, or the Python GT's) as a timeline picture: lanes for
    /// clients, the dispatcher and workers; executed instructions as bars; signals as red lines.
    Visualize {
        /// The log (`GT_INSTRUCTION_LOG`, or a `gt trace` capture).
        log: std::path::PathBuf,
        /// The picture to write.
        #[arg(short, long, default_value = "tape_timeline.png")]
        output: std::path::PathBuf,
        /// Resolution in dots per inch.
        #[arg(long, default_value_t = 150)]
        dpi: u32,
        /// png, svg, or perfetto (Chrome trace-event JSON, as `gt perfetto`); default: from
        /// the output's extension, else png.
        #[arg(long)]
        format: Option<VisualFormat>,
    },
    /// Profiles (`gt-run --profile DIR`): reports, sweeps, kernel time spread, merged traces,
    /// sweep comparisons.
    Prof {
        #[command(subcommand)]
        command: prof::ProfCommand,
    },
    /// Convert an instruction log (gt's, or the Python GT's) to a Chrome trace-event JSON file
    /// that Perfetto (ui.perfetto.dev) and chrome://tracing open.
    Perfetto {
        /// The log (`GT_INSTRUCTION_LOG`, or a `gt trace` capture).
        log: std::path::PathBuf,
        /// The JSON file to write.
        #[arg(short, long, default_value = "trace.json")]
        output: std::path::PathBuf,
    },
}

/// A line on stdout. A closed stdout (`gt server | head -1`) is no reason to stop a server
/// or fail a tool whose work is done, as `println!`'s panic would.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Runs the `gt` command line on `args` (the first item is the program name) and gives the
/// process exit code (0 clean stop, 1 runtime failure, 2 usage error, bad input or nothing to
/// run on). `--help`, `--version` and usage errors print clap's message and give its code (0 or
/// 2) instead of exiting the process.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            // As `Args::parse` would, without leaving the process: help and version on stdout,
            // errors on stderr.
            let _ = e.print();
            let _ = std::io::Write::flush(&mut std::io::stdout());
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    crate::logging::init("warn");
    let env = match EnvConfig::from_env() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    // `--key` wins over GT_KEY_FILE; a file that cannot be used is a usage error.
    let load_key = |flag: Option<PathBuf>| -> Result<Option<(PathBuf, ClusterKey)>, u8> {
        let Some(path) = flag.or_else(|| env.key_file.clone()) else { return Ok(None) };
        match ClusterKey::load(&path) {
            Ok(key) => Ok(Some((path, key))),
            Err(e) => {
                eprintln!("error: {e}");
                Err(2)
            }
        }
    };
    match args.command {
        Command::Keygen { path, force } => report(keygen(path, force)),
        Command::Server { port, host, workers, monitor_port, key, insecure } => {
            let Some(monitor_port) = monitor_port.or(port.checked_add(1)) else {
                eprintln!("error: port {port} has no PORT + 1 for the monitor; pass --monitor-port");
                return 2;
            };
            let key = match load_key(key) {
                Ok(k) => k,
                Err(code) => return code,
            };
            server((port, monitor_port), &host, usize::from(workers), (key, insecure), &env)
        }
        Command::Worker { host, port, name, backend, wait, reconnect, threads, connect, key } => {
            let endpoint = match connect.map(|c| Endpoint::parse(&c)).transpose() {
                Ok(e) => e.unwrap_or_else(|| Endpoint::for_peer(&host, port)),
                Err(e) => {
                    eprintln!("error: --connect: {e}");
                    return 2;
                }
            };
            let key = match load_key(key) {
                Ok(k) => k.map(|(_, k)| k),
                Err(code) => return code,
            };
            let cores = crate::runtime::config::cores();
            let threads = match threads.or(env.threads).unwrap_or(cores) {
                t if (1..=cores).contains(&t) => t,
                t => {
                    eprintln!("error: --threads {t}: give 1 to {cores} (this machine's cores)");
                    return 2;
                }
            };
            worker(&endpoint, name, (backend, threads, key), (wait, reconnect), &env)
        }
        Command::Perfetto { log, output } => report(perfetto(&log, &output)),
        Command::Prof { command } => report(prof::run(command)),
        Command::Visualize { log, output, dpi, format } => report(visualize(&log, output, dpi, format)),
        Command::Top { host, port, ema_alpha, key } => {
            let key = match load_key(key) {
                Ok(k) => k.map(|(_, k)| k),
                Err(code) => return code,
            };
            let options = crate::tools::top::TopOptions { host, port, ema_alpha, key, ..Default::default() };
            match crate::tools::top::run(&options) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    2
                }
            }
        }
        Command::Trace { seconds, max_events, host, port, dir, output, key } => {
            let key = match load_key(key) {
                Ok(k) => k.map(|(_, k)| k),
                Err(code) => return code,
            };
            report(trace((seconds, max_events), (&host, port), &dir, (output, key)))
        }
    }
}

/// A tool's outcome: its error on one line, exit code 2 (bad input).
fn report(result: anyhow::Result<()>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            // The chain, each cause once (library errors already name their source).
            let mut message = String::new();
            for cause in e.chain().map(|c| c.to_string()) {
                if !message.contains(&cause) {
                    message += if message.is_empty() { "" } else { ": " };
                    message += &cause;
                }
            }
            eprintln!("error: {message}");
            2
        }
    }
}

fn trace(
    (seconds, max_events): (f64, Option<usize>),
    (host, port): (&str, Option<u16>),
    dir: &std::path::Path,
    (output, key): (Option<std::path::PathBuf>, Option<ClusterKey>),
) -> anyhow::Result<()> {
    use anyhow::{bail, Context};
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 7.0 * 86400.0) {
        bail!("--seconds {seconds}: give a positive number of seconds (at most a week)");
    }
    use crate::tools::discover::MonitorTarget;
    if port.is_none() && !crate::transport::endpoint::is_local(host) {
        bail!("give the port of the dispatcher on {host} with -p PORT");
    }
    let target = MonitorTarget::new(host, port)
        .with_context(|| format!("port {} has no PORT + 1 for its monitor", port.unwrap_or(0)))?;
    let monitor = target.find().with_context(|| match port {
        Some(p) => format!("no dispatcher on port {p} on this machine (is `gt server -p {p}` running?)"),
        None => "no running dispatcher found on this machine (start `gt server`, or a run with GT_MONITOR=1; or pass -p PORT)"
            .to_string(),
    })?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let output = match output {
        Some(name) => dir.join(name),
        None => crate::tools::capture::default_output(dir),
    };
    let limit = max_events.map(|n| format!(" or {n} events")).unwrap_or_default();
    say!("Capturing {} for {seconds} s{limit} into {}", monitor.endpoint, output.display());
    let options = crate::tools::capture::CaptureOptions {
        monitor,
        duration: std::time::Duration::from_secs_f64(seconds),
        max_events,
        output: output.clone(),
        key,
    };
    let got = crate::tools::capture::capture(&options)?;
    say!("✓ Captured {} events into {}", got.events, output.display());
    if got.rejected > 0 {
        say!("  Skipped: {} messages that were not events (another gt version?)", got.rejected);
    }
    if got.dispatcher_gone {
        say!("  The dispatcher stopped during the capture.");
    }
    say!("  Draw it: gt visualize {} | gt perfetto {}", output.display(), output.display());
    Ok(())
}

/// What `gt visualize` writes.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum VisualFormat {
    Png,
    Svg,
    Perfetto,
}

fn visualize(
    log: &std::path::Path,
    output: std::path::PathBuf,
    dpi: u32,
    format: Option<VisualFormat>,
) -> anyhow::Result<()> {
    use crate::tools::visualize::{render, ImageFormat, VisualizeOptions};
    let format = format.unwrap_or(match ImageFormat::from_path(&output) {
        Some(ImageFormat::Svg) => VisualFormat::Svg,
        _ if output.extension().is_some_and(|e| e == "json") => VisualFormat::Perfetto,
        _ => VisualFormat::Png,
    });
    let image = match format {
        VisualFormat::Perfetto => return perfetto(log, &output),
        VisualFormat::Png => ImageFormat::Png,
        VisualFormat::Svg => ImageFormat::Svg,
    };
    let tape = crate::tools::tape::Tape::read(log)?;
    let summary = render(&tape, &VisualizeOptions { output, dpi, format: image })?;
    say!("{summary}");
    if tape.skipped > 0 {
        say!("  Skipped: {} lines that were not events", tape.skipped);
    }
    Ok(())
}

fn perfetto(log: &std::path::Path, output: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let tape = crate::tools::tape::Tape::read(log)?;
    let file = std::fs::File::create(output).with_context(|| format!("cannot write {}", output.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let counts =
        crate::tools::perfetto::write(&tape, &mut out).with_context(|| format!("cannot write {}", output.display()))?;
    std::io::Write::flush(&mut out).with_context(|| format!("cannot write {}", output.display()))?;
    say!("✓ Trace saved to: {} (open it in ui.perfetto.dev or chrome://tracing)", output.display());
    say!("  Events: {} ({} log)", tape.events.len(), tape.format.name());
    say!(
        "  Executed: {} slices, {} flows, {} signal scopes, {} counter samples",
        counts.slices,
        counts.flows,
        counts.signals,
        counts.counters
    );
    if tape.skipped > 0 {
        say!("  Skipped: {} lines that were not events", tape.skipped);
    }
    Ok(())
}

/// `gt keygen`: a new cluster key file, never replacing one unless told to.
fn keygen(path: Option<PathBuf>, force: bool) -> anyhow::Result<()> {
    let path = match path {
        Some(p) => p,
        None => crate::transport::auth::default_key_path()?,
    };
    let key = ClusterKey::generate()?;
    key.save(&path, force)?;
    say!("wrote a new cluster key to {} (mode 0600; public key {})", path.display(), key.public_z85());
    say!("copy it to every machine of the cluster, then start each member with it:");
    say!("  gt server --host 0.0.0.0 --key {}", path.display());
    say!("  gt worker --host SERVER --key {}", path.display());
    say!("  gt-run --connect SERVER:9000 --key {} SCRIPT (or GT_KEY_FILE={})", path.display(), path.display());
    Ok(())
}

fn server(
    (port, monitor_port): (u16, u16),
    host: &str,
    workers: usize,
    (key, insecure): (Option<(PathBuf, ClusterKey)>, bool),
    env: &EnvConfig,
) -> u8 {
    let mut options = ClusterOptions::embedded(workers);
    options.apply(env);
    options.listen = Endpoint::for_server(host, port);
    options.monitor = ClusterOptions::server_monitor(host, port, monitor_port);
    options.discovery_name = Some(port.to_string());
    options.key = key.as_ref().map(|(_, k)| k.clone());
    options.insecure |= insecure;
    let open = key.is_none() && !crate::transport::endpoint::is_loopback(host);
    let cluster = match Cluster::start(options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            let usage = matches!(e, ClusterError::Backend(_) | ClusterError::Insecure { .. });
            return if usage { 2 } else { 1 };
        }
    };
    if open {
        eprintln!(
            "warning: listening on {host} without a cluster key (--insecure): anyone who reaches port {port} can run work and read data"
        );
    }
    let listen: Vec<String> = cluster.listen().iter().map(|e| e.to_string()).collect();
    say!("gt server listening on {}", listen.join(" and "));
    for m in cluster.monitor() {
        say!("gt server monitor on {m}");
    }
    let key_arg = match &key {
        Some((path, k)) => {
            say!("gt server lets in over TCP only holders of {} (public key {})", path.display(), k.public_z85());
            format!(" --key {}", path.display())
        }
        None => String::new(),
    };
    say!("workers join with: gt worker --host {} -p {port}{key_arg}", if host == "0.0.0.0" { "HOST" } else { host });
    let stopper = cluster.stopper();
    if let Err(e) = ctrlc::set_handler(move || stopper.stop()) {
        eprintln!("warning: cannot catch Ctrl-C ({e}); stop the server with SIGKILL");
    }
    cluster.wait();
    0
}

fn worker(
    endpoint: &Endpoint,
    name: Option<String>,
    (backend, threads, key): (BackendKind, usize, Option<ClusterKey>),
    (wait, reconnect): (u64, u64),
    env: &EnvConfig,
) -> u8 {
    let name = name.unwrap_or_else(|| format!("worker@{}-{}", hostname(), std::process::id()));
    let mut options = WorkerOptions::named(name);
    options.max_message_bytes = env.max_message_bytes;
    options.register_timeout = std::time::Duration::from_secs(wait);
    options.backend = backend;
    options.matmul_precision = env.matmul_precision;
    options.jit = env.jit;
    options.memory_budget = env.worker_memory;
    options.collective_timeout = env.collective_timeout;
    options.op_timeout = env.op_timeout;
    options.spin = env.spin;
    options.threads = threads;
    options.key = key;
    let ctx = crate::transport::zmq::Context::new();
    let reconnect = std::time::Duration::from_secs(reconnect);
    match run_worker_reconnecting(&ctx, endpoint, &options, reconnect) {
        Ok(()) => 0,
        // Nothing to run on: no dispatcher (or none that lets this worker in), or no GPU / no
        // CUDA in this build.
        Err(e @ (WorkerError::NoDispatcher { .. } | WorkerError::Handshake { .. } | WorkerError::Backend(_))) => {
            eprintln!("error: {e}");
            2
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "host".into())
}

#[cfg(test)]
mod tests {
    use super::run;

    #[test]
    fn help_version_and_usage_errors_give_codes_without_exiting() {
        assert_eq!(run(["gt", "--version"]), 0);
        assert_eq!(run(["gt", "server", "--help"]), 0);
        assert_eq!(run(["gt", "no-such-command"]), 2);
        assert_eq!(run(["gt", "worker", "--threads", "many"]), 2);
    }

    #[test]
    fn runs_twice_in_one_process() {
        // Logging is installed by the first run; the second finds it there.
        for _ in 0..2 {
            assert_eq!(run(["gt", "visualize", "/nonexistent/gt-cli-test.log"]), 2);
        }
    }
}
