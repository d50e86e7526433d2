//! Endpoints: `inproc://NAME` (embedded: dispatcher, workers and client in one process),
//! `ipc:///path` (same host, a Unix socket) and `tcp://HOST:PORT` (remote). A server on
//! `PORT` listens on TCP and on the IPC path [`ipc_path`]`(PORT)`; a peer told `HOST:PORT`
//! takes IPC when `HOST` is this machine and that socket file exists, TCP otherwise. A
//! server asked for `0.0.0.0` listens on TCP on every interface (and on IPC).

use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Where a socket binds or connects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// In-process.
    Inproc(String),
    /// A Unix-domain socket.
    Ipc(PathBuf),
    /// TCP.
    Tcp {
        /// Host name or address (`*` or `0.0.0.0`: every interface, when binding).
        host: String,
        /// Port.
        port: u16,
    },
}

/// An endpoint string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("bad endpoint `{text}`: {why} (expected HOST:PORT, tcp://HOST:PORT, ipc:///PATH or inproc://NAME)")]
pub struct EndpointError {
    /// The text given.
    pub text: String,
    /// What is wrong.
    pub why: &'static str,
}

/// This user's directory for gt's sockets and discovery files: `$XDG_RUNTIME_DIR/gt` (that
/// directory is the user's alone), else `gt-UID` under the temp dir. Nothing of gt's lives at
/// a predictable path another user could take first ([`ensure_runtime_dir`] makes it).
pub fn runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("gt"),
        None => std::env::temp_dir().join(format!("gt-{}", nix::unistd::getuid())),
    }
}

/// Why the runtime directory cannot be trusted.
#[derive(Debug, Error)]
pub enum RuntimeDirError {
    /// It could not be made or read.
    #[error("cannot use gt's runtime directory {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a directory (a link, a file).
    #[error("gt's runtime directory {path} is not a directory; remove it (another user may have planted it)")]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// It is another user's.
    #[error("gt's runtime directory {path} is owned by user {uid}; remove it (another user may have planted it)")]
    NotOurs {
        /// The directory.
        path: PathBuf,
        /// Its owner's uid.
        uid: u32,
    },
}

/// Makes [`runtime_dir`] (mode 0700) or checks the one there: a real directory (not a link),
/// owned by this user, which others cannot enter (its mode is set back to 0700 if it was
/// wider).
pub fn ensure_runtime_dir() -> Result<PathBuf, RuntimeDirError> {
    ensure_private_dir(runtime_dir())
}

#[cfg(unix)]
pub(crate) fn ensure_private_dir(path: PathBuf) -> Result<PathBuf, RuntimeDirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let io = |source| RuntimeDirError::Io { path: path.clone(), source };
    match std::fs::DirBuilder::new().mode(0o700).create(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let meta = std::fs::symlink_metadata(&path).map_err(io)?;
    if !meta.file_type().is_dir() {
        return Err(RuntimeDirError::NotADirectory { path });
    }
    if meta.uid() != nix::unistd::getuid().as_raw() {
        return Err(RuntimeDirError::NotOurs { path, uid: meta.uid() });
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(path)
}

#[cfg(not(unix))]
pub(crate) fn ensure_private_dir(path: PathBuf) -> Result<PathBuf, RuntimeDirError> {
    std::fs::create_dir_all(&path).map_err(|source| RuntimeDirError::Io { path: path.clone(), source })?;
    Ok(path)
}

/// The Unix socket a server on `port` listens on, besides TCP.
pub fn ipc_path(port: u16) -> PathBuf {
    runtime_dir().join(format!("{port}.ipc"))
}

/// The Unix socket of the monitor PUB socket of the server on `port`.
pub fn monitor_ipc_path(port: u16) -> PathBuf {
    runtime_dir().join(format!("{port}-monitor.ipc"))
}

/// The file where a running dispatcher writes its endpoints (for `gt top`, `gt trace` and
/// other tools): `name` is the port, or `embedded-PID`.
pub fn discovery_path(name: &str) -> PathBuf {
    runtime_dir().join(format!("{name}.dispatcher"))
}

/// Writes a private file (mode 0600) in a fresh inode: whatever was at `path` (a stale file,
/// a link someone planted) is removed first, and the file is created exclusively, so nothing
/// is written through a link.
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    create_private(path)?.write_all(contents)
}

/// [`write_private`]'s new file, empty and open for reading and writing.
pub(crate) fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// Makes a socket file this user's alone (mode 0600).
pub fn make_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Whether `host` names this machine's loopback only (not every interface): a server bound
/// there cannot be reached from other machines.
pub fn is_loopback(host: &str) -> bool {
    matches!(host, "localhost" | "::1" | "[::1]") || host.starts_with("127.")
}

/// Whether `host` names this machine's loopback (or every interface, which includes it).
pub fn is_local(host: &str) -> bool {
    matches!(host, "localhost" | "::1" | "[::1]" | "0.0.0.0" | "*" | "") || host.starts_with("127.")
}

impl Endpoint {
    /// Parses `inproc://NAME`, `ipc://PATH`, `tcp://HOST:PORT` or `HOST:PORT` (which
    /// resolves like [`Endpoint::for_peer`]).
    pub fn parse(text: &str) -> Result<Endpoint, EndpointError> {
        let err = |why| EndpointError { text: text.to_string(), why };
        if let Some(name) = text.strip_prefix("inproc://") {
            if name.is_empty() {
                return Err(err("empty inproc name"));
            }
            return Ok(Endpoint::Inproc(name.to_string()));
        }
        if let Some(path) = text.strip_prefix("ipc://") {
            if path.is_empty() {
                return Err(err("empty ipc path"));
            }
            return Ok(Endpoint::Ipc(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("tcp://") {
            let (host, port) = split_host_port(rest).map_err(err)?;
            return Ok(Endpoint::Tcp { host, port });
        }
        if text.contains("://") {
            return Err(err("unknown scheme"));
        }
        let (host, port) = split_host_port(text).map_err(err)?;
        Ok(Endpoint::for_peer(&host, port))
    }

    /// Where a client or worker told `host:port` connects: IPC when the host is this
    /// machine and a server listens on its IPC socket, else TCP. (A socket file left by a
    /// server that was killed refuses connections, so it is not taken.)
    pub fn for_peer(host: &str, port: u16) -> Endpoint {
        let ipc = ipc_path(port);
        if is_local(host) && ours(&ipc) && ipc_listening(&ipc) {
            Endpoint::Ipc(ipc)
        } else {
            let host = if matches!(host, "0.0.0.0" | "*" | "") { "127.0.0.1" } else { host };
            Endpoint::Tcp { host: host.to_string(), port }
        }
    }

    /// Where a server on `host:port` listens: TCP on `host` (every interface for `0.0.0.0`)
    /// and IPC at [`ipc_path`].
    pub fn for_server(host: &str, port: u16) -> Vec<Endpoint> {
        let host = if matches!(host, "0.0.0.0" | "") { "*" } else { host };
        vec![Endpoint::Tcp { host: host.to_string(), port }, Endpoint::Ipc(ipc_path(port))]
    }

    /// The ZeroMQ address string.
    pub fn zmq_address(&self) -> String {
        self.to_string()
    }

    /// The socket file of an IPC endpoint.
    pub fn ipc_file(&self) -> Option<&Path> {
        match self {
            Endpoint::Ipc(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Inproc(name) => write!(f, "inproc://{name}"),
            Endpoint::Ipc(path) => write!(f, "ipc://{}", path.display()),
            Endpoint::Tcp { host, port } if host.contains(':') && !host.starts_with('[') => {
                write!(f, "tcp://[{host}]:{port}")
            }
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
        }
    }
}

/// Whether `path` is a socket of this user's in a runtime directory only this user can enter
/// (another user's socket is never taken for the dispatcher: it would get the client's data).
#[cfg(unix)]
fn ours(path: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let me = nix::unistd::getuid().as_raw();
    let private_dir = path
        .parent()
        .and_then(|d| std::fs::symlink_metadata(d).ok())
        .is_some_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o077 == 0);
    let own_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket() && m.uid() == me);
    private_dir && own_socket
}

#[cfg(not(unix))]
fn ours(_: &Path) -> bool {
    true
}

#[cfg(unix)]
fn ipc_listening(path: &Path) -> bool {
    // Connecting and closing at once is harmless to a ZeroMQ listener.
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

#[cfg(not(unix))]
fn ipc_listening(_: &Path) -> bool {
    false
}

fn split_host_port(text: &str) -> Result<(String, u16), &'static str> {
    let (host, port) = text.rsplit_once(':').ok_or("no `:PORT`")?;
    let port: u16 = port.parse().map_err(|_| "the port is not a number from 0 to 65535")?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err("no host");
    }
    Ok((host.to_string(), port))
}

/// For a `tcp://HOST:PORT` endpoint whose host does not resolve, the host and why: ZeroMQ
/// would retry it quietly, so a peer waiting for an answer would blame a missing server.
pub fn unresolvable_host(endpoint: &str) -> Option<(String, std::io::Error)> {
    use std::net::ToSocketAddrs;
    let address = endpoint.strip_prefix("tcp://")?;
    let host = address.rsplit_once(':')?.0.trim_start_matches('[').trim_end_matches(']');
    if host == "*" {
        return None;
    }
    match address.to_socket_addrs() {
        Ok(_) => None,
        Err(e) => Some((host.to_string(), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        crate::testing::scratch("endpoint", name)
    }

    #[cfg(unix)]
    #[test]
    fn the_runtime_directory_is_private_and_checked() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = scratch("dir");
        // Made 0700; a wider mode on our own directory is narrowed.
        let made = ensure_private_dir(d.join("gt")).unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(made.clone()).unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o777, 0o700);
        // A link or a file planted at the path is refused.
        std::os::unix::fs::symlink(&d, d.join("link")).unwrap();
        let e = ensure_private_dir(d.join("link")).unwrap_err().to_string();
        assert!(e.contains("not a directory") && e.contains("planted"), "{e}");
        std::fs::write(d.join("file"), b"").unwrap();
        assert!(ensure_private_dir(d.join("file")).is_err());
        // Another user's directory (only root can make one here).
        if nix::unistd::getuid().is_root() {
            let theirs = d.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let e = ensure_private_dir(theirs).unwrap_err().to_string();
            assert!(e.contains("owned by user 65534"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn private_files_are_0600_and_never_written_through_a_link() {
        use std::os::unix::fs::MetadataExt;
        let d = scratch("files");
        let target = d.join("victim");
        std::fs::write(&target, b"keep").unwrap();
        let planted = d.join("x.dispatcher");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        write_private(&planted, b"pid=1\n").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(&planted).unwrap(), b"pid=1\n");
        assert_eq!(std::fs::symlink_metadata(&planted).unwrap().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn only_our_sockets_in_a_private_directory_are_taken() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("sockets");
        let private = ensure_private_dir(d.join("gt")).unwrap();
        let path = private.join("9.ipc");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(ours(&path));
        // In a directory others can write to, a socket could be anyone's.
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!ours(&path));
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        if nix::unistd::getuid().is_root() {
            nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            assert!(!ours(&path), "another user's socket was taken");
        }
        // A plain file is no socket.
        std::fs::write(private.join("8.ipc"), b"").unwrap();
        assert!(!ours(&private.join("8.ipc")));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(Endpoint::parse("inproc://gt").unwrap(), Endpoint::Inproc("gt".into()));
        assert_eq!(Endpoint::parse("ipc:///tmp/x.ipc").unwrap(), Endpoint::Ipc("/tmp/x.ipc".into()));
        assert_eq!(
            Endpoint::parse("tcp://10.0.0.2:9000").unwrap(),
            Endpoint::Tcp { host: "10.0.0.2".into(), port: 9000 }
        );
        assert_eq!(Endpoint::parse("gpu-box:9000").unwrap(), Endpoint::Tcp { host: "gpu-box".into(), port: 9000 });
        assert_eq!(Endpoint::parse("tcp://[::1]:5").unwrap().to_string(), "tcp://[::1]:5");
        for bad in ["", "host", "host:", "host:99999", ":80", "udp://x:1", "inproc://", "ipc://"] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert!(e.to_string().contains("expected HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn server_on_every_interface_listens_on_tcp() {
        let eps = Endpoint::for_server("0.0.0.0", 9100);
        assert_eq!(eps[0], Endpoint::Tcp { host: "*".into(), port: 9100 });
        assert_eq!(eps[1], Endpoint::Ipc(ipc_path(9100)));
    }

    #[test]
    fn a_stale_ipc_socket_file_is_not_taken() {
        let port = 1;
        ensure_runtime_dir().unwrap();
        let path = ipc_path(port);
        let _ = std::fs::remove_file(&path);
        // A socket file with no listener, as a killed server leaves behind.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        assert_eq!(Endpoint::for_peer("localhost", port), Endpoint::Tcp { host: "localhost".into(), port });
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn only_loopback_hosts_are_loopback() {
        for h in ["127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["0.0.0.0", "*", "", "10.0.0.2", "gpu-box", "::", "128.0.0.1"] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn local_peer_without_ipc_socket_uses_tcp() {
        assert_eq!(Endpoint::for_peer("localhost", 1), Endpoint::Tcp { host: "localhost".into(), port: 1 });
        assert_eq!(Endpoint::for_peer("0.0.0.0", 1), Endpoint::Tcp { host: "127.0.0.1".into(), port: 1 });
    }

    #[test]
    fn a_host_that_does_not_resolve_is_named() {
        // `.invalid` never resolves (RFC 2606); addresses and listeners need no resolver.
        let (host, _) = unresolvable_host("tcp://nohost.invalid:9000").unwrap();
        assert_eq!(host, "nohost.invalid");
        for fine in ["tcp://127.0.0.1:9", "tcp://[::1]:9", "tcp://*:9", "ipc:///tmp/x.ipc", "inproc://a"] {
            assert!(unresolvable_host(fine).is_none(), "{fine}");
        }
    }
}
