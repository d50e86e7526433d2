//! `gt trace`: captures a running dispatcher's events from its monitor socket into a log
//! file in gt's log format (so `gt visualize` and `gt perfetto` read it), for a number of
//! seconds or events. The dispatcher publishes only while someone subscribes, so a capture
//! costs a run nothing before and after.

use crate::discover::MonitorInfo;
use gt_transport::event::log_header;
use gt_transport::{codec, zmq, LogEvent};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;

/// What to capture.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The dispatcher's monitor socket.
    pub monitor: MonitorInfo,
    /// How long to listen.
    pub duration: Duration,
    /// Stop after this many events.
    pub max_events: Option<usize>,
    /// The log file to write.
    pub output: PathBuf,
    /// The cluster key (`--key`, `GT_KEY_FILE`), which a remote dispatcher's TCP monitor
    /// demands.
    pub key: Option<gt_transport::ClusterKey>,
}

/// What a capture got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Captured {
    /// Events written.
    pub events: usize,
    /// Frames that were not events (another protocol version, garbage).
    pub rejected: usize,
    /// Whether the dispatcher went away during the capture.
    pub dispatcher_gone: bool,
}

/// Why a capture failed.
#[derive(Debug, Error)]
pub enum CaptureError {
    /// The monitor socket could not be connected.
    #[error("cannot connect to the monitor socket {endpoint}: {source}")]
    Connect {
        /// Where.
        endpoint: String,
        /// Why.
        source: zmq::Error,
    },
    /// Receiving failed.
    #[error("monitor socket {endpoint}: {source}")]
    Receive {
        /// Where.
        endpoint: String,
        /// Why.
        source: zmq::Error,
    },
    /// The log file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Listens on `options.monitor` and writes what arrives to `options.output`.
pub fn capture(options: &CaptureOptions) -> Result<Captured, CaptureError> {
    let write_err = |source| CaptureError::Write { path: options.output.clone(), source };
    let file = create(&options.output).map_err(write_err)?;
    let mut out = BufWriter::new(file);
    let started = humantime_now();
    let limit = match options.max_events {
        Some(n) => format!("{n} events or {:.1} s", options.duration.as_secs_f64()),
        None => format!("{:.1} s", options.duration.as_secs_f64()),
    };
    let header = log_header(&started).replace(
        "gt dispatcher instruction stream\n",
        &format!("gt dispatcher instruction stream (trace capture of {})\nLimit: {limit}\n", options.monitor.endpoint),
    );
    out.write_all(header.as_bytes()).map_err(write_err)?;
    let ctx = zmq::Context::new();
    let endpoint = &options.monitor.endpoint;
    let connect_err = |source| CaptureError::Connect { endpoint: endpoint.clone(), source };
    let sub = ctx.socket(zmq::SUB).map_err(connect_err)?;
    sub.set_linger(0).map_err(connect_err)?;
    sub.set_rcvhwm(0).map_err(connect_err)?;
    sub.set_subscribe(b"").map_err(connect_err)?;
    sub.set_ipv6(true).map_err(connect_err)?;
    gt_transport::socket::connect(&sub, endpoint, options.key.as_ref()).map_err(connect_err)?;
    let recv_err = |source| CaptureError::Receive { endpoint: endpoint.clone(), source };
    let deadline = Instant::now() + options.duration;
    let mut got = Captured::default();
    let mut last_check = Instant::now();
    while options.max_events.is_none_or(|n| got.events < n) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let ready = match sub.poll(zmq::POLLIN, left.as_millis().clamp(1, 200) as i64) {
            Err(zmq::Error::EINTR) => continue,
            r => r.map_err(recv_err)?,
        };
        if ready == 0 {
            if last_check.elapsed() > Duration::from_millis(500) {
                last_check = Instant::now();
                // A dispatcher that stopped ends the capture instead of waiting out its time.
                if !options.monitor.is_alive() {
                    got.dispatcher_gone = true;
                    break;
                }
            }
            continue;
        }
        while options.max_events.is_none_or(|n| got.events < n) {
            let frame = match sub.recv_bytes(zmq::DONTWAIT) {
                Ok(f) => f,
                Err(zmq::Error::EAGAIN) => break,
                Err(zmq::Error::EINTR) => continue,
                Err(e) => return Err(recv_err(e)),
            };
            match codec::decode::<LogEvent>(&frame, codec::DEFAULT_MAX_MESSAGE_BYTES) {
                Ok(event) => {
                    writeln!(out, "{event}").map_err(write_err)?;
                    got.events += 1;
                }
                Err(_) => got.rejected += 1,
            }
        }
    }
    out.flush().map_err(write_err)?;
    Ok(got)
}

/// The default name of a capture in `dir`: `trace_YYYYMMDD_HHMMSS.log`, as the Python GT's.
pub fn default_output(dir: &Path) -> PathBuf {
    dir.join(format!("trace_{}.log", stamp()))
}

/// Now as `YYYYMMDD_HHMMSS` (UTC), for default file names.
pub(crate) fn stamp() -> String {
    // 2026-11-24T20:00:00Z -> 20261124_200000
    humantime_now().chars().filter(|c| c.is_ascii_digit() || *c == 'T').collect::<String>().replace('T', "_")
}

/// Now, as RFC 3339 to the second.
pub(crate) fn humantime_now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// A capture holds what the dispatcher logs, literal data included: this user's only.
fn create(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::Tape;
    use gt_transport::EventKind;

    fn monitor(endpoint: String) -> MonitorInfo {
        MonitorInfo { endpoint, pid: None, name: "test".into(), dispatcher: None, file: None, written: None }
    }

    fn event(seq: u64) -> LogEvent {
        LogEvent {
            elapsed: seq as f64 * 0.001,
            seq,
            kind: EventKind::Exec,
            source: "WORKER w".into(),
            command: "add".into(),
            bytes: 16,
            duration: Some(0.000001),
            details: format!("client=1 #{seq} %b1 = add %b0, %b0"),
        }
    }

    #[test]
    fn captures_what_a_monitor_publishes_into_a_readable_log() {
        let dir = std::env::temp_dir().join(format!("gt-capture-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let endpoint = format!("ipc://{}", dir.join("m.ipc").display());
        let ctx = zmq::Context::new();
        let publisher = ctx.socket(zmq::XPUB).unwrap();
        publisher.bind(&endpoint).unwrap();
        let output = dir.join("out.log");
        let options = CaptureOptions {
            monitor: monitor(endpoint),
            duration: Duration::from_secs(20),
            max_events: Some(5),
            output: output.clone(),
            key: None,
        };
        let capture = std::thread::spawn(move || capture(&options));
        // Publish once someone subscribed (the XPUB hears the subscription), with garbage
        // in between, which is counted and skipped.
        assert_eq!(publisher.recv_bytes(0).unwrap(), b"\x01");
        publisher.send(&b"garbage"[..], 0).unwrap();
        for seq in 1..=7 {
            publisher.send(codec::encode(&event(seq), 1 << 20).unwrap(), 0).unwrap();
        }
        let got = capture.join().unwrap().unwrap();
        assert_eq!(got, Captured { events: 5, rejected: 1, dispatcher_gone: false });
        let tape = Tape::read(&output).unwrap();
        assert_eq!(tape.events, (1..=5).map(event).collect::<Vec<_>>());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_dispatcher_that_goes_away_ends_the_capture() {
        let dir = std::env::temp_dir().join(format!("gt-capture-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let options = CaptureOptions {
            monitor: monitor(format!("ipc://{}", dir.join("nobody.ipc").display())),
            duration: Duration::from_secs(600),
            max_events: None,
            output: dir.join("out.log"),
            key: None,
        };
        let got = capture(&options).unwrap();
        assert_eq!(got, Captured { events: 0, rejected: 0, dispatcher_gone: true });
        assert!(default_output(&dir).file_name().unwrap().to_str().unwrap().starts_with("trace_20"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
