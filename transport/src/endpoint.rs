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

/// The Unix socket a server on `port` listens on, besides TCP.
pub fn ipc_path(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("gt-{port}.ipc"))
}

/// The Unix socket of the monitor PUB socket of the server on `port`.
pub fn monitor_ipc_path(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("gt-{port}-monitor.ipc"))
}

/// The file where a running dispatcher writes its endpoints (for `gt top`, `gt trace` and
/// other tools): `name` is the port, or `embedded-PID`.
pub fn discovery_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gt-{name}.dispatcher"))
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
        if is_local(host) && ipc_listening(&ipc) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let path = ipc_path(port);
        let _ = std::fs::remove_file(&path);
        // A socket file with no listener, as a killed server leaves behind.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        assert_eq!(Endpoint::for_peer("localhost", port), Endpoint::Tcp { host: "localhost".into(), port });
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn local_peer_without_ipc_socket_uses_tcp() {
        assert_eq!(Endpoint::for_peer("localhost", 1), Endpoint::Tcp { host: "localhost".into(), port: 1 });
        assert_eq!(Endpoint::for_peer("0.0.0.0", 1), Endpoint::Tcp { host: "127.0.0.1".into(), port: 1 });
    }
}
