//! Finding running dispatchers' monitor sockets, for `gt top` and `gt trace`: each
//! dispatcher writes a discovery file `NAME.dispatcher` in gt's runtime directory
//! ([`gt_transport::endpoint::discovery_path`]; `NAME` is the port, or `embedded-PID`) with
//! lines `pid=N`, `endpoint=...` and `monitor=...`. A killed dispatcher leaves its file
//! behind, so a file counts only while its process lives and its socket file is there.

use gt_transport::endpoint::{discovery_path, is_local, monitor_ipc_path, runtime_dir};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The suffix of a discovery file.
const SUFFIX: &str = ".dispatcher";

/// The most of a discovery file read: it holds three short lines, so anything longer is
/// not one of ours.
const MAX_FILE_BYTES: u64 = 4096;

/// A running dispatcher's monitor socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorInfo {
    /// Where its monitor publishes (`ipc:///...` or `tcp://...`).
    pub endpoint: String,
    /// Its process, when known.
    pub pid: Option<u32>,
    /// The discovery file's name without `.dispatcher`: the port, or `embedded-PID`.
    pub name: String,
    /// Where clients connect (its `endpoint=` line), when given.
    pub dispatcher: Option<String>,
    /// The discovery file, when the monitor was found through one.
    pub file: Option<PathBuf>,
    /// When the discovery file was written (newer dispatchers are preferred).
    pub written: Option<SystemTime>,
}

impl MonitorInfo {
    /// The monitor's socket file, for an `ipc://` endpoint.
    pub fn ipc_file(&self) -> Option<&Path> {
        self.endpoint.strip_prefix("ipc://").map(Path::new)
    }

    /// Whether the dispatcher still seems to run: its process lives (when known) and its
    /// socket file is there (for `ipc://`). A remote monitor always seems to.
    pub fn is_alive(&self) -> bool {
        self.pid.is_none_or(pid_alive) && self.ipc_file().is_none_or(Path::exists)
    }
}

/// Whether process `pid` exists and has not exited. Reads `/proc`; where there is none, every process is taken
/// to be alive (the socket file check still applies).
pub fn pid_alive(pid: u32) -> bool {
    // Pid 0 is no process of anyone's (and 'everyone in my group' to kill(2)).
    if pid == 0 {
        return false;
    }
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return true;
    }
    // A killed process stays in /proc as a zombie until its parent reaps it; it is gone
    // all the same. (The state follows the command name, which may hold `)`.)
    match std::fs::read_to_string(proc.join(pid.to_string()).join("stat")) {
        Ok(stat) => {
            !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z' | 'X'))
        }
        Err(_) => false,
    }
}

/// Whether something listens on the Unix socket at `path` (a killed process leaves its
/// socket file behind, refusing connections). Where there are no Unix sockets, whether the
/// file exists.
pub fn socket_listening(path: &Path) -> bool {
    #[cfg(unix)]
    {
        // Connecting and closing at once is harmless to a ZeroMQ listener.
        std::os::unix::net::UnixStream::connect(path).is_ok()
    }
    #[cfg(not(unix))]
    {
        path.exists()
    }
}

/// Parses a discovery file's text; `None` if it names no monitor. Of several monitors the
/// first `ipc://` one is taken (the file is on this machine), else the first one, a TCP
/// listener on every interface (`tcp://*:P`, `tcp://0.0.0.0:P`) connected to on loopback.
pub fn parse_discovery(name: &str, text: &str) -> Option<MonitorInfo> {
    let mut info = MonitorInfo {
        endpoint: String::new(),
        pid: None,
        name: name.to_string(),
        dispatcher: None,
        file: None,
        written: None,
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else { continue };
        let value = value.trim();
        match key.trim() {
            "pid" => info.pid = value.parse().ok(),
            "endpoint" if !value.is_empty() => info.dispatcher = Some(value.to_string()),
            "monitor" if !value.is_empty() => {
                let ipc = value.starts_with("ipc://");
                if info.endpoint.is_empty() || (ipc && !info.endpoint.starts_with("ipc://")) {
                    info.endpoint = value.to_string();
                }
            }
            _ => {}
        }
    }
    info.endpoint = connectable(&info.endpoint);
    (!info.endpoint.is_empty()).then_some(info)
}

/// Where to connect to a listener's endpoint on this machine: a wildcard host (every
/// interface) becomes loopback, as ZeroMQ cannot connect to `*`.
fn connectable(endpoint: &str) -> String {
    for (wildcard, loopback) in
        [("tcp://*:", "tcp://127.0.0.1:"), ("tcp://0.0.0.0:", "tcp://127.0.0.1:"), ("tcp://[::]:", "tcp://[::1]:")]
    {
        if let Some(port) = endpoint.strip_prefix(wildcard) {
            return format!("{loopback}{port}");
        }
    }
    endpoint.to_string()
}

/// Reads one discovery file (no liveness check); `None` if it is not a readable regular
/// file naming a monitor.
pub fn read_discovery(path: &Path) -> Option<MonitorInfo> {
    let name = path.file_name()?.to_str()?.strip_suffix(SUFFIX)?;
    // Not through a link: the file is only trusted as the one the dispatcher wrote.
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let mut info = parse_discovery(name, &text)?;
    info.file = Some(path.to_path_buf());
    info.written = meta.modified().ok();
    Some(info)
}

/// The live monitors described in `dir`, newest discovery file first.
pub fn discover_in(dir: &Path) -> Vec<MonitorInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<MonitorInfo> =
        entries.filter_map(|entry| read_discovery(&entry.ok()?.path())).filter(MonitorInfo::is_alive).collect();
    // Newest first; equal times by name, so the order is the same on every scan.
    found.sort_by(|a, b| b.written.cmp(&a.written).then_with(|| a.name.cmp(&b.name)));
    found
}

/// The live monitors of this user's dispatchers on this machine, newest first.
pub fn discover_monitors() -> Vec<MonitorInfo> {
    discover_in(&runtime_dir())
}

/// The monitor of the local server on `port`: from its discovery file when that is there
/// and alive, else its monitor socket [`monitor_ipc_path`] when that file exists (a server
/// that wrote no discovery file); `None` while neither is there.
pub fn local_monitor(port: u16) -> Option<MonitorInfo> {
    if let Some(info) = read_discovery(&discovery_path(&port.to_string())).filter(MonitorInfo::is_alive) {
        return Some(info);
    }
    let ipc = monitor_ipc_path(port);
    ipc.exists().then(|| MonitorInfo {
        endpoint: format!("ipc://{}", ipc.display()),
        pid: None,
        name: port.to_string(),
        dispatcher: None,
        file: None,
        written: None,
    })
}

/// The monitor of a server on another machine: `tcp://HOST:PORT+1`; `None` for port 65535,
/// which has no next port.
pub fn remote_monitor(host: &str, port: u16) -> Option<MonitorInfo> {
    let monitor_port = port.checked_add(1)?;
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
    Some(MonitorInfo {
        endpoint: format!("tcp://{host}:{monitor_port}"),
        pid: None,
        name: port.to_string(),
        dispatcher: Some(format!("tcp://{host}:{port}")),
        file: None,
        written: None,
    })
}

/// Where a tool looks for a dispatcher: `gt top` and `gt trace`'s `--host`/`-p`.
#[derive(Debug, Clone)]
pub enum MonitorTarget {
    /// The newest dispatcher with a live discovery file on this machine.
    Newest,
    /// The server on this port on this machine.
    Local(u16),
    /// A server on another machine.
    Remote(MonitorInfo),
}

impl MonitorTarget {
    /// The dispatcher at `host` on `port` (no port: the newest on this machine); `None` for
    /// a remote server on port 65535, which has no next port for its monitor.
    pub fn new(host: &str, port: Option<u16>) -> Option<MonitorTarget> {
        Some(match port {
            None => MonitorTarget::Newest,
            Some(port) if is_local(host) => MonitorTarget::Local(port),
            Some(port) => MonitorTarget::Remote(remote_monitor(host, port)?),
        })
    }

    /// The monitor to watch now, if one is there.
    pub fn find(&self) -> Option<MonitorInfo> {
        match self {
            MonitorTarget::Newest => discover_monitors().into_iter().next(),
            MonitorTarget::Local(port) => local_monitor(*port).filter(|m| {
                // Without a discovery file there is no pid to check, and a killed server
                // leaves its socket file: take it only if something listens there.
                m.pid.is_some() || m.ipc_file().is_none_or(socket_listening)
            }),
            MonitorTarget::Remote(info) => Some(info.clone()),
        }
    }

    /// What the waiting screen says is looked for.
    pub fn looking(&self) -> String {
        match self {
            MonitorTarget::Newest => {
                format!("looking for dispatchers (*.dispatcher files) in {}", runtime_dir().display())
            }
            MonitorTarget::Local(port) => {
                format!("looking for the server on port {port} ({})", discovery_path(&port.to_string()).display())
            }
            MonitorTarget::Remote(info) => format!("connecting to {}", info.endpoint),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A scratch directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gt-discover-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A pid no process has (over Linux's largest, 2^22).
    const DEAD: u32 = 4_000_000_000;

    /// Writes a discovery file for a monitor socket file `NAME-monitor.ipc` in `dir`
    /// (created), with the given pid and age.
    fn dispatcher(dir: &Path, name: &str, pid: u32, age_s: u64) -> String {
        let sock = dir.join(format!("{name}-monitor.ipc"));
        std::fs::write(&sock, b"").unwrap();
        let endpoint = format!("ipc://{}", sock.display());
        let file = dir.join(format!("{name}.dispatcher"));
        std::fs::write(&file, format!("pid={pid}\nendpoint=tcp://127.0.0.1:{name}\nmonitor={endpoint}\n")).unwrap();
        let when = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::options().write(true).open(&file).unwrap().set_modified(when).unwrap();
        endpoint
    }

    #[test]
    fn the_newest_live_dispatcher_comes_first() {
        let d = scratch("newest");
        let me = std::process::id();
        let old = dispatcher(&d, "9000", me, 100);
        let new = dispatcher(&d, "9100", me, 10);
        // Newer still, but its process is gone.
        dispatcher(&d, "9200", DEAD, 1);
        // Alive, but its socket file was removed.
        let gone = dispatcher(&d, "9300", me, 2);
        std::fs::remove_file(gone.strip_prefix("ipc://").unwrap()).unwrap();
        // Not discovery files at all.
        std::fs::write(d.join("9400.ipc"), b"").unwrap();
        std::fs::write(d.join("junk.dispatcher"), b"\xff\xfe garbage without a monitor line").unwrap();
        std::fs::write(d.join("huge.dispatcher"), "x".repeat(10_000)).unwrap();

        let found = discover_in(&d);
        let endpoints: Vec<_> = found.iter().map(|m| m.endpoint.as_str()).collect();
        assert_eq!(endpoints, [new.as_str(), old.as_str()]);
        assert_eq!(found[0].name, "9100");
        assert_eq!(found[0].pid, Some(me));
        assert_eq!(found[0].dispatcher.as_deref(), Some("tcp://127.0.0.1:9100"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn nothing_found_in_an_empty_or_missing_directory() {
        let d = scratch("empty");
        assert!(discover_in(&d).is_empty());
        assert!(discover_in(&d.join("missing")).is_empty());
        dispatcher(&d, "9000", DEAD, 0);
        assert!(discover_in(&d).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn a_linked_discovery_file_is_not_read() {
        let d = scratch("link");
        dispatcher(&d, "9000", std::process::id(), 0);
        std::fs::rename(d.join("9000.dispatcher"), d.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), d.join("9000.dispatcher")).unwrap();
        assert!(discover_in(&d).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn discovery_lines_parse_loosely() {
        let m = parse_discovery("embedded-7", "pid=7\nmonitor=ipc:///x/m.ipc\nsomething else\n").unwrap();
        assert_eq!((m.pid, m.endpoint.as_str(), m.dispatcher.as_deref()), (Some(7), "ipc:///x/m.ipc", None));
        assert_eq!(m.ipc_file(), Some(Path::new("/x/m.ipc")));
        let m = parse_discovery("9", "pid=notanumber\nmonitor=tcp://h:10").unwrap();
        assert_eq!((m.pid, m.ipc_file()), (None, None));
        assert!(m.is_alive(), "a remote monitor without a pid is taken as alive");
        assert_eq!(parse_discovery("9", "pid=1\nendpoint=tcp://h:9\n"), None);
        // A server listening on every interface writes its IPC monitor and a wildcard TCP
        // one: the IPC one is taken whatever the order, and a wildcard alone means loopback.
        for text in ["monitor=ipc:///x/m.ipc\nmonitor=tcp://*:10\n", "monitor=tcp://*:10\nmonitor=ipc:///x/m.ipc\n"] {
            assert_eq!(parse_discovery("9", text).unwrap().endpoint, "ipc:///x/m.ipc");
        }
        assert_eq!(parse_discovery("9", "monitor=tcp://*:10").unwrap().endpoint, "tcp://127.0.0.1:10");
        assert_eq!(parse_discovery("9", "monitor=tcp://0.0.0.0:10").unwrap().endpoint, "tcp://127.0.0.1:10");
        assert_eq!(parse_discovery("9", "monitor=tcp://[::]:10").unwrap().endpoint, "tcp://[::1]:10");
        assert_eq!(parse_discovery("9", ""), None);
    }

    #[test]
    fn pids() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(DEAD));
        assert!(!pid_alive(0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_exited_child_not_yet_reaped_is_dead() {
        let Ok(mut child) = std::process::Command::new("true").spawn() else { return };
        let pid = child.id();
        // Until `wait`, the exited child is a zombie that /proc still lists.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pid_alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        assert!(!pid_alive(pid));
        child.wait().unwrap();
    }

    #[test]
    fn remote_monitors_are_on_the_next_port() {
        assert_eq!(remote_monitor("gpu-box", 9000).unwrap().endpoint, "tcp://gpu-box:9001");
        assert_eq!(remote_monitor("::1", 9000).unwrap().endpoint, "tcp://[::1]:9001");
        assert_eq!(remote_monitor("gpu-box", 65535), None);
    }
}
