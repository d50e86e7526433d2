//! The instruction log: every dispatcher event, written to `GT_INSTRUCTION_LOG` in the
//! seeds' line format and published on the monitor socket. Nothing is formatted unless a
//! file is open or a subscriber listens ([`EventLog::active`]), and nothing is kept in
//! memory beyond the file's write buffer, which is flushed whenever the dispatcher idles.

use gt_transport::event::log_header;
use gt_transport::zmq;
use gt_transport::{codec, EventKind, LogEvent};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

/// Where events go.
pub struct EventLog {
    start: Instant,
    seq: u64,
    file: Option<BufWriter<File>>,
    monitor: Option<zmq::Socket>,
    subscribers: i64,
}

/// Opens a log (or profile) file for writing, readable by this user only (a log holds literal
/// tensor data), and never through a symbolic link someone planted at its path.
pub(super) fn private_file(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits());
    }
    options.open(path)
}

impl EventLog {
    /// A log to `path` (if any) and to the `monitor` XPUB socket (if any).
    pub fn new(path: Option<&Path>, monitor: Option<zmq::Socket>) -> std::io::Result<EventLog> {
        let file = match path {
            Some(p) => {
                let mut f = BufWriter::new(private_file(p)?);
                f.write_all(log_header(&now_rfc3339()).as_bytes())?;
                f.flush()?;
                Some(f)
            }
            None => None,
        };
        Ok(EventLog { start: Instant::now(), seq: 0, file, monitor, subscribers: 0 })
    }

    /// Whether an event would go anywhere; callers skip building details when not.
    #[inline]
    pub fn active(&self) -> bool {
        self.file.is_some() || self.subscribers > 0
    }

    /// The monitor socket, for polling subscriptions.
    pub fn monitor(&self) -> Option<&zmq::Socket> {
        self.monitor.as_ref()
    }

    /// Reads subscription changes from the monitor socket.
    pub fn poll_subscriptions(&mut self) {
        let Some(m) = &self.monitor else { return };
        while let Ok(msg) = m.recv_bytes(zmq::DONTWAIT) {
            match msg.first() {
                Some(1) => self.subscribers += 1,
                Some(0) => self.subscribers = (self.subscribers - 1).max(0),
                _ => {}
            }
        }
    }

    /// Nanoseconds since the dispatcher started: the log's clock.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Records one event, now.
    pub fn emit(&mut self, kind: EventKind, source: String, command: &str, bytes: usize, details: String) {
        if self.active() {
            let elapsed = self.start.elapsed().as_secs_f64();
            self.record(kind, source, command, bytes, (elapsed, None), details);
        }
    }

    /// Records an event that happened at `start` (ns on the log's clock) and lasted
    /// `nanos` (`None`: an instant).
    pub fn emit_at(
        &mut self,
        kind: EventKind,
        source: String,
        command: &str,
        bytes: u64,
        (start, nanos): (u64, Option<u64>),
        details: String,
    ) {
        if self.active() {
            let when = (start as f64 * 1e-9, nanos.map(|n| n as f64 * 1e-9));
            self.record(kind, source, command, bytes as usize, when, details);
        }
    }

    fn record(
        &mut self,
        kind: EventKind,
        source: String,
        command: &str,
        bytes: usize,
        (elapsed, duration): (f64, Option<f64>),
        details: String,
    ) {
        self.seq += 1;
        let event = LogEvent {
            elapsed,
            seq: self.seq,
            kind,
            source,
            command: command.to_string(),
            bytes: bytes as u64,
            duration,
            details,
        };
        if let Some(f) = &mut self.file {
            if let Err(e) = writeln!(f, "{event}") {
                tracing::error!(target: "gt::dispatcher", "instruction log: write failed, logging stops: {e}");
                self.file = None;
            }
        }
        if self.subscribers > 0 {
            if let (Some(m), Ok(bytes)) = (&self.monitor, codec::encode(&event, codec::DEFAULT_MAX_MESSAGE_BYTES)) {
                // A slow subscriber loses events rather than slowing the dispatcher.
                let _ = m.send(bytes, zmq::DONTWAIT);
            }
        }
    }

    /// Writes buffered lines out (called when the dispatcher idles and at shutdown).
    pub fn flush(&mut self) {
        if let Some(f) = &mut self.file {
            let _ = f.flush();
        }
    }
}

/// Now, as RFC 3339 to the second (the log's header, a profile's manifest).
pub(super) fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
