//! The instruction-log event: one line of `GT_INSTRUCTION_LOG` and one message of the
//! dispatcher's monitor socket. The line format is the seeds':
//! `elapsed | #seq | EVENT | source | command | bytes | details`, e.g.
//! `  0.004120311s | #0012 | WORKER_SEND  | WORKER worker-0             | Exec            |      1.2KB | batch=3 [8 ops: ...]`,
//! with nanoseconds in `elapsed` (the seeds' readers take any decimals) and, for events
//! that last (an executed instruction), the duration as the first detail: `dur=0.000012345s`.
//! The monitor publishes the same [`LogEvent`] in msgpack (codec header included).

use serde::{Deserialize, Serialize};
use std::fmt;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// The dispatcher received a client's instruction or request.
    Recv,
    /// The dispatcher answered a client.
    Send,
    /// The dispatcher sent a worker a batch or request.
    WorkerSend,
    /// A worker answered the dispatcher.
    WorkerRecv,
    /// A client or worker joined.
    Connect,
    /// A client or worker left (said goodbye, or was found gone).
    Disconnect,
    /// A signal scope began or ended.
    Signal,
    /// A pass injected an instruction.
    Inject,
    /// A message was rejected (garbage, wrong version, too large, unknown peer).
    Error,
    /// A worker executed an instruction (a `fused` kernel is one): `elapsed` is when it
    /// started, on the dispatcher's clock, and `duration` how long it ran. Details:
    /// `client=C #SEQ` (the client's instruction it came from), `result=f32[2,3]` (its
    /// result types, when it has results), then the instruction in worker buffer ids.
    /// Logged when the worker reports, so not in `elapsed` order.
    Exec,
    /// A periodic reading of a gauge: a worker's `memory` (`live=BYTES`), a client's
    /// `queue` (`instrs=N bytes=B`: sent to its worker and not yet run).
    Status,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 11] = [
        EventKind::Recv,
        EventKind::Send,
        EventKind::WorkerSend,
        EventKind::WorkerRecv,
        EventKind::Connect,
        EventKind::Disconnect,
        EventKind::Signal,
        EventKind::Inject,
        EventKind::Error,
        EventKind::Exec,
        EventKind::Status,
    ];

    /// The name in the log.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Recv => "RECV",
            EventKind::Send => "SEND",
            EventKind::WorkerSend => "WORKER_SEND",
            EventKind::WorkerRecv => "WORKER_RECV",
            EventKind::Connect => "CONNECT",
            EventKind::Disconnect => "DISCONNECT",
            EventKind::Signal => "SIGNAL",
            EventKind::Inject => "INJECT",
            EventKind::Error => "ERROR",
            EventKind::Exec => "EXEC",
            EventKind::Status => "STATUS",
        }
    }

    /// Looks a kind up by its log name.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEvent {
    /// Seconds since the dispatcher started.
    pub elapsed: f64,
    /// Sequence number, from 1.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
    /// `CLIENT 3`, `WORKER worker-0`, `DISPATCHER`.
    pub source: String,
    /// The message or instruction (`Exec`, `Get`, `add`).
    pub command: String,
    /// Bytes on the wire (0: none or not applicable).
    pub bytes: u64,
    /// How long it lasted, in seconds (an [`EventKind::Exec`]); `None` for instants.
    pub duration: Option<f64>,
    /// Free text (`%3 = add %1, %2`, `batch=4 [8 ops: ...]`).
    pub details: String,
}

/// The detail that carries a duration.
const DURATION: &str = "dur=";

/// Formats a byte count as the log does: `117B`, `1.2KB`, `3.81MB`.
pub fn format_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes}B")
    } else if bytes < 1024 * 1024 {
        format!("{:.1}KB", bytes as f64 / 1024.0)
    } else {
        format!("{:.2}MB", bytes as f64 / (1024.0 * 1024.0))
    }
}

fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() {
        return Some(0);
    }
    let (num, scale) = if let Some(n) = s.strip_suffix("MB") {
        (n, 1024.0 * 1024.0)
    } else if let Some(n) = s.strip_suffix("KB") {
        (n, 1024.0)
    } else {
        (s.strip_suffix('B')?, 1.0)
    };
    let v: f64 = num.parse().ok()?;
    Some((v * scale).round() as u64)
}

impl fmt::Display for LogEvent {
    /// The log line (no newline). A size of 0 leaves the bytes column blank.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = if self.bytes == 0 { String::new() } else { format_bytes(self.bytes) };
        write!(
            f,
            "{:>13.9}s | #{:04} | {:<12} | {:<27} | {:<15} | {:>10} | ",
            self.elapsed,
            self.seq,
            self.kind.name(),
            self.source,
            self.command,
            bytes,
        )?;
        if let Some(d) = self.duration {
            write!(f, "{DURATION}{d:.9}s")?;
            if !self.details.is_empty() {
                f.write_str(" ")?;
            }
        }
        f.write_str(&self.details)
    }
}

impl LogEvent {
    /// Parses a log line written by [`fmt::Display`]; `None` for header lines and anything
    /// else. Byte counts come back rounded as printed.
    pub fn parse_line(line: &str) -> Option<LogEvent> {
        let mut parts = line.splitn(7, " | ");
        // A time that is no finite number is no event (it has no place on a timeline).
        let elapsed = parts.next()?.trim().strip_suffix('s')?.parse().ok().filter(|x: &f64| x.is_finite())?;
        let seq = parts.next()?.trim().strip_prefix('#')?.parse().ok()?;
        let kind = EventKind::from_name(parts.next()?.trim())?;
        let source = parts.next()?.trim().to_string();
        let command = parts.next()?.trim().to_string();
        let bytes = parse_bytes(parts.next()?)?;
        let mut details = parts.next().unwrap_or("").trim_end();
        let mut duration = None;
        if let Some(rest) = details.strip_prefix(DURATION) {
            let (d, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            duration = Some(d.strip_suffix('s')?.parse().ok().filter(|x: &f64| x.is_finite() && *x >= 0.0)?);
            details = rest;
        }
        Some(LogEvent { elapsed, seq, kind, source, command, bytes, duration, details: details.to_string() })
    }
}

/// The header of a log file, written once when it is opened.
pub fn log_header(started: &str) -> String {
    let rule = "=".repeat(100);
    format!(
        "{rule}\ngt dispatcher instruction stream\nStarted: {started}\n{rule}\n\n\
         Events: RECV/SEND (client <-> dispatcher), WORKER_SEND/WORKER_RECV (dispatcher <-> worker),\n\
         CONNECT/DISCONNECT (peers joining and leaving), SIGNAL, INJECT (added by a pass), ERROR (rejected message),\n\
         EXEC (a worker ran an instruction: elapsed is its start, dur= its duration), STATUS (gauges: memory, queues).\n\
         Format: <elapsed> | #<seq> | <event> | <source> | <command> | <bytes> | [dur=<seconds>s] <details>\n\
         RECV details are the instruction in the client's value ids; WORKER_* details use worker buffer ids.\n\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_round_trip() {
        let e = LogEvent {
            elapsed: 1.608,
            seq: 11,
            kind: EventKind::Recv,
            source: "CLIENT 1".into(),
            command: "add".into(),
            bytes: 117,
            duration: None,
            details: "%2 = add %0, %1".into(),
        };
        let line = e.to_string();
        assert_eq!(
            line,
            "  1.608000000s | #0011 | RECV         | CLIENT 1                    | add             |       117B | %2 = add %0, %1"
        );
        assert_eq!(LogEvent::parse_line(&line), Some(e.clone()));
        assert_eq!(LogEvent::parse_line("===="), None);
        let exec = LogEvent {
            kind: EventKind::Exec,
            elapsed: 1.6081234,
            duration: Some(0.000012345),
            details: "client=1 #7 %b2 = add %b0, %b1".into(),
            ..e
        };
        let line = exec.to_string();
        assert!(line.ends_with("| dur=0.000012345s client=1 #7 %b2 = add %b0, %b1"), "{line}");
        let back = LogEvent::parse_line(&line).unwrap();
        assert_eq!((back.duration, back.details.as_str()), (exec.duration, exec.details.as_str()));
        assert!((back.elapsed - 1.608123400).abs() < 1e-12);
        let bare = LogEvent { details: String::new(), ..exec };
        assert_eq!(LogEvent::parse_line(&bare.to_string()).unwrap().duration, bare.duration);
    }

    #[test]
    fn sizes() {
        assert_eq!(format_bytes(117), "117B");
        assert_eq!(format_bytes(123 * 1024), "123.0KB");
        assert_eq!(format_bytes(4_000_000), "3.81MB");
        assert_eq!(parse_bytes("1.0KB"), Some(1024));
        assert_eq!(parse_bytes(""), Some(0));
        assert_eq!(parse_bytes("x"), None);
    }
}
