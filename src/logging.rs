//! Diagnostic logging for the binaries: `tracing` to stderr, quiet by default. `GT_VERBOSE=1`
//! shows start-up and connection messages (info); `GT_DEBUG_CLIENT`, `GT_DEBUG_DISPATCHER`,
//! `GT_DEBUG_WORKER` and `GT_DEBUG_COMPILE` (the fuse pass's regions and the JIT's
//! compiles, with their times) turn on debug messages of that component; `RUST_LOG` (an
//! `EnvFilter` directive) overrides all of them. The instruction log is separate
//! (`GT_INSTRUCTION_LOG`).

use tracing_subscriber::EnvFilter;

/// The filter directive the `GT_*` variables ask for, over `default` (`error` for `gt-run`,
/// `warn` for `gt server` and `gt worker`).
pub fn directive(default: &str, get: impl Fn(&str) -> Option<String>) -> String {
    let on = |k: &str| get(k).is_some_and(|v| !matches!(v.trim(), "" | "0" | "false"));
    let mut d = if on("GT_VERBOSE") { "info".to_string() } else { default.to_string() };
    for (var, target) in [
        ("GT_DEBUG_CLIENT", "gt::client"),
        ("GT_DEBUG_DISPATCHER", "gt::dispatcher"),
        ("GT_DEBUG_WORKER", "gt::worker"),
        ("GT_DEBUG_COMPILE", "gt::compile"),
    ] {
        if on(var) {
            d.push_str(&format!(",{target}=debug"));
        }
    }
    d
}

/// Installs the stderr logger (once; later calls do nothing).
pub fn init(default: &str) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(r) if !r.is_empty() => EnvFilter::try_new(&r).unwrap_or_else(|_| EnvFilter::new(default)),
        _ => EnvFilter::new(directive(default, |k| std::env::var(k).ok())),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(true)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::directive;

    #[test]
    fn variables_map_to_levels() {
        assert_eq!(directive("error", |_| None), "error");
        assert_eq!(directive("error", |k| (k == "GT_VERBOSE").then(|| "1".into())), "info");
        assert_eq!(directive("warn", |k| (k == "GT_DEBUG_WORKER").then(|| "1".into())), "warn,gt::worker=debug");
        assert_eq!(directive("warn", |k| (k == "GT_DEBUG_WORKER").then(|| "0".into())), "warn");
        assert_eq!(directive("error", |k| (k == "GT_DEBUG_COMPILE").then(|| "1".into())), "error,gt::compile=debug");
    }
}
