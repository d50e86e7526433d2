//! Reading instruction logs into one time-ordered [`Tape`]: gt's own format
//! (`gt_transport::event`), and the Python GT's two (its "format B",
//! `  0.123s | #0042 | RECV | CLIENT 127.0.0.1:1 | BinaryOp | 123KB | result=42 op=add`, with
//! the size column present only when not zero, and the older "format A",
//! `[TAPE 0.003s] WORKER_SEND  | auto_worker | WorkerOp | op=matmul`), so its users can bring
//! old logs. Also where each event is drawn ([`Lane`]) and its op family ([`OpFamily`]).

use gt_ir::ops::{BinaryOp, ReduceOp, UnaryOp};
use gt_transport::{EventKind, LogEvent};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The log formats read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// gt's own.
    Gt,
    /// The Python GT's `elapsed | #seq | ...` lines.
    PythonSeq,
    /// The Python GT's `[TAPE 0.003s] ...` lines.
    PythonTape,
}

impl LogFormat {
    /// A name for messages.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Gt => "gt",
            LogFormat::PythonSeq => "Python GT",
            LogFormat::PythonTape => "Python GT [TAPE]",
        }
    }
}

/// Why a log could not be read.
#[derive(Debug, Error)]
pub enum TapeError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("{path} is empty: no instruction log was written there (was GT_INSTRUCTION_LOG set?)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// Nothing in the file looks like a log line.
    #[error("{path} is not an instruction log: no line is a log event (line {line}: {text:?})")]
    Foreign {
        /// The file.
        path: PathBuf,
        /// The first line that is not a header line.
        line: usize,
        /// Its text (clipped).
        text: String,
    },
    /// A log with its header and no event.
    #[error("{path} holds no events: the run logged nothing")]
    NoEvents {
        /// The file.
        path: PathBuf,
    },
}

/// The events of one log, sorted by time (ties in log order).
#[derive(Debug, Clone)]
pub struct Tape {
    /// The events.
    pub events: Vec<LogEvent>,
    /// Which format the log was in.
    pub format: LogFormat,
    /// Lines that were neither events nor header (a truncated last line, say).
    pub skipped: usize,
}

/// Lines longer than this are not events (a log line holds one instruction's text, which a
/// `fused` kernel can make long, but not this long): they are skipped unread.
const MAX_LINE: usize = 1 << 20;

impl Tape {
    /// Reads the log at `path`.
    pub fn read(path: &Path) -> Result<Tape, TapeError> {
        let io = |source| TapeError::Io { path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let mut tape = Tape::from_reader(BufReader::new(file), path)?;
        tape.sort();
        Ok(tape)
    }

    /// Reads a log from `reader` (`path` names it in errors).
    pub fn from_reader(mut reader: impl BufRead, path: &Path) -> Result<Tape, TapeError> {
        let io = |source| TapeError::Io { path: path.to_path_buf(), source };
        let mut events = Vec::new();
        let mut format = None;
        let (mut skipped, mut lines, mut first_foreign) = (0, 0, None);
        let (mut in_header, mut titled) = (false, false);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = (&mut reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            lines += 1;
            if buf.len() > MAX_LINE && buf.last() != Some(&b'\n') {
                // Skip the rest of an overlong line.
                skipped += 1;
                let mut sink = Vec::new();
                reader.read_until(b'\n', &mut sink).map_err(io)?;
                continue;
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.to_ascii_lowercase().contains("dispatcher instruction stream") {
                // A header: what follows up to the first event describes the format.
                (in_header, titled) = (true, true);
                if line.contains("GT2 Dispatcher Instruction Stream") {
                    format.get_or_insert(LogFormat::PythonSeq);
                }
                continue;
            }
            match parse_any(line, format) {
                Some((e, f)) => {
                    format.get_or_insert(f);
                    events.push(e);
                    in_header = false;
                }
                None if in_header || line.trim().is_empty() || line.starts_with("====") => {}
                None => {
                    skipped += 1;
                    first_foreign.get_or_insert_with(|| (lines, clip(line)));
                }
            }
        }
        if lines == 0 {
            return Err(TapeError::Empty { path: path.to_path_buf() });
        }
        if events.is_empty() {
            return Err(match first_foreign {
                Some((line, text)) if !titled => TapeError::Foreign { path: path.to_path_buf(), line, text },
                _ => TapeError::NoEvents { path: path.to_path_buf() },
            });
        }
        let format = format.unwrap_or(LogFormat::Gt);
        Ok(Tape { events, format, skipped })
    }

    /// Sorts by time, keeping log order among equal times (EXEC events are logged when the
    /// worker reports, after the instruction ran).
    pub fn sort(&mut self) {
        self.events.sort_by(|a, b| a.elapsed.total_cmp(&b.elapsed).then(a.seq.cmp(&b.seq)));
    }

    /// The time of the last event's end, in seconds since the dispatcher started.
    pub fn end(&self) -> f64 {
        self.events.iter().map(|e| e.elapsed + e.duration.unwrap_or(0.0)).fold(0.0, f64::max)
    }

    /// The lanes with events, in drawing order: clients, the dispatcher, workers (each group
    /// in order of first appearance).
    pub fn lanes(&self) -> Vec<Lane> {
        let mut clients = Vec::new();
        let mut workers = Vec::new();
        let mut dispatcher = false;
        for e in &self.events {
            match Lane::of(e) {
                Lane::Dispatcher => dispatcher = true,
                l @ Lane::Client(_) if !clients.contains(&l) => clients.push(l),
                l @ Lane::Worker(_) if !workers.contains(&l) => workers.push(l),
                _ => {}
            }
        }
        let mut lanes = clients;
        if dispatcher || !self.events.is_empty() {
            lanes.push(Lane::Dispatcher);
        }
        lanes.extend(workers);
        lanes
    }

    /// The worker names, in order of first appearance.
    pub fn workers(&self) -> Vec<String> {
        self.lanes()
            .into_iter()
            .filter_map(|l| match l {
                Lane::Worker(w) => Some(w),
                _ => None,
            })
            .collect()
    }
}

/// Where an event happened.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// A client's requests and the answers it got: `RECV`, `SEND`, its `CONNECT` and
    /// `DISCONNECT`, its `SIGNAL`s and queue `STATUS`.
    Client(String),
    /// The dispatcher itself: `INJECT` (a pass), `ERROR`, anything without a peer.
    Dispatcher,
    /// A worker: what was sent to it and what it answered (`WORKER_SEND`, `WORKER_RECV`),
    /// what it executed (`EXEC`), its memory `STATUS`.
    Worker(String),
}

impl Lane {
    /// The lane of `e`, read from its source (`CLIENT 3`, `WORKER worker-0`).
    pub fn of(e: &LogEvent) -> Lane {
        if let Some(w) = e.source.strip_prefix("WORKER ") {
            return Lane::Worker(w.to_string());
        }
        if e.kind == EventKind::Error || e.kind == EventKind::Inject {
            return Lane::Dispatcher;
        }
        match e.source.strip_prefix("CLIENT ") {
            Some(c) => Lane::Client(c.to_string()),
            None => Lane::Dispatcher,
        }
    }

    /// Its label: `client 1`, `dispatcher`, `worker-0`.
    pub fn label(&self) -> String {
        match self {
            Lane::Client(c) => format!("client {c}"),
            Lane::Dispatcher => "dispatcher".to_string(),
            Lane::Worker(w) => w.clone(),
        }
    }
}

/// Op families, each with the seed visualizer's colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpFamily {
    /// `matmul`: red.
    MatMul,
    /// Elementwise binary ops: blue.
    Binary,
    /// Elementwise unary ops (other than relu): green.
    Unary,
    /// `relu`: dark grey.
    Relu,
    /// `sum`: purple.
    Sum,
    /// `mean`: teal.
    Mean,
    /// Other reductions (`max`, `min`): also purple, lighter.
    Reduce,
    /// Reads (`get`, `Data`): dark orange.
    Get,
    /// Collectives and moves between workers (`all_gather`...): dark red.
    Collective,
    /// `free`: light grey.
    Free,
    /// `fused` kernels: gold.
    Fused,
    /// Creation (`randn`, `zeros`, literals): brown.
    Create,
    /// Views and data movement (`reshape`, `transpose`, `concat`...): slate.
    Shape,
    /// Batches, syncs, markers and the rest: grey-blue.
    Other,
}

impl OpFamily {
    /// Every family, in legend order.
    pub const ALL: [OpFamily; 14] = [
        OpFamily::MatMul,
        OpFamily::Binary,
        OpFamily::Unary,
        OpFamily::Relu,
        OpFamily::Sum,
        OpFamily::Mean,
        OpFamily::Reduce,
        OpFamily::Get,
        OpFamily::Collective,
        OpFamily::Free,
        OpFamily::Fused,
        OpFamily::Create,
        OpFamily::Shape,
        OpFamily::Other,
    ];

    /// The family of a command (an instruction's mnemonic, a message name, or one of the
    /// Python GT's command names such as `BinaryOp` with its `op=` detail).
    pub fn of(command: &str, details: &str) -> OpFamily {
        // The Python GT names message types; the op is in the details.
        let op = match command {
            "BinaryOp" | "UnaryOp" | "WorkerOp" | "WorkerBinaryOp" | "WorkerUnaryOp" => {
                detail(details, "op").unwrap_or(command)
            }
            _ => command,
        };
        match op {
            "matmul" | "MatMul" | "WorkerMatMul" => OpFamily::MatMul,
            "relu" => OpFamily::Relu,
            "sum" => OpFamily::Sum,
            "mean" => OpFamily::Mean,
            "fused" => OpFamily::Fused,
            "free" | "FreeTensor" | "WorkerFreeTensor" => OpFamily::Free,
            "get" | "Get" | "Data" | "GetData" | "WorkerGetData" => OpFamily::Get,
            "randn" | "rand" | "zeros" | "ones" | "full" | "arange" | "tensor" | "CreateTensor" => OpFamily::Create,
            "transpose" | "permute" | "reshape" | "squeeze" | "unsqueeze" | "broadcast_to" | "concat" | "slice"
            | "split" | "chunk" | "where" | "ReshapeOp" | "SliceOp" | "ConcatOp" | "CopyTensor" => OpFamily::Shape,
            "BinaryOp" => OpFamily::Binary,
            "UnaryOp" => OpFamily::Unary,
            _ if op.contains("gather")
                || op.contains("Gather")
                || op.contains("reduce_scatter")
                || op.starts_with("all_")
                || op == "broadcast"
                || op == "move" =>
            {
                OpFamily::Collective
            }
            _ if BinaryOp::from_mnemonic(op).is_some() => OpFamily::Binary,
            _ if UnaryOp::from_mnemonic(op).is_some() => OpFamily::Unary,
            _ if ReduceOp::from_mnemonic(op).is_some() => OpFamily::Reduce,
            _ => OpFamily::Other,
        }
    }

    /// Its name in legends.
    pub fn name(self) -> &'static str {
        match self {
            OpFamily::MatMul => "matmul",
            OpFamily::Binary => "binary",
            OpFamily::Unary => "unary",
            OpFamily::Relu => "relu",
            OpFamily::Sum => "sum",
            OpFamily::Mean => "mean",
            OpFamily::Reduce => "max/min",
            OpFamily::Get => "get",
            OpFamily::Collective => "collective",
            OpFamily::Free => "free",
            OpFamily::Fused => "fused",
            OpFamily::Create => "create",
            OpFamily::Shape => "view/copy",
            OpFamily::Other => "other",
        }
    }

    /// Its colour (RGB): the seed's legend where it names one.
    pub fn rgb(self) -> (u8, u8, u8) {
        match self {
            OpFamily::MatMul => (220, 20, 60),
            OpFamily::Binary => (30, 90, 220),
            OpFamily::Unary => (34, 150, 34),
            OpFamily::Relu => (64, 64, 64),
            OpFamily::Sum => (128, 0, 128),
            OpFamily::Mean => (0, 128, 128),
            OpFamily::Reduce => (186, 85, 211),
            OpFamily::Get => (255, 140, 0),
            OpFamily::Collective => (139, 0, 0),
            OpFamily::Free => (200, 200, 200),
            OpFamily::Fused => (218, 165, 32),
            OpFamily::Create => (139, 90, 43),
            OpFamily::Shape => (112, 128, 144),
            OpFamily::Other => (100, 149, 237),
        }
    }
}

/// The value of `key=value` in `details`.
pub fn detail<'a>(details: &'a str, key: &str) -> Option<&'a str> {
    details.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// An EXEC event's origin: the client and its instruction's sequence number
/// (`client=C #SEQ` in its details).
pub fn exec_origin(e: &LogEvent) -> Option<(String, u64)> {
    let client = detail(&e.details, "client")?;
    let seq = e.details.split_whitespace().find_map(|w| w.strip_prefix('#')?.parse().ok())?;
    Some((client.to_string(), seq))
}

/// A RECV or SIGNAL event's client sequence number (`#SEQ` first in its details).
pub fn recv_seq(e: &LogEvent) -> Option<u64> {
    e.details.split_whitespace().next()?.strip_prefix('#')?.parse().ok()
}

fn clip(line: &str) -> String {
    line.chars().take(80).collect()
}

/// One line, in the format the log has shown so far if any (a Python GT line with a size
/// column also reads as one of ours, with the wrong source). A time that is no finite
/// number (`nans`, `infs`) makes no event in any format: it has no place on a timeline.
fn parse_any(line: &str, known: Option<LogFormat>) -> Option<(LogEvent, LogFormat)> {
    if known != Some(LogFormat::PythonSeq) {
        if let Some(e) = LogEvent::parse_line(line) {
            let doubled = ["CLIENT CLIENT ", "WORKER WORKER "].iter().any(|p| e.source.starts_with(p));
            if !doubled {
                return Some((e, LogFormat::Gt));
            }
        }
    }
    if let Some(e) = parse_python_seq(line) {
        return Some((e, LogFormat::PythonSeq));
    }
    parse_python_tape(line).map(|e| (e, LogFormat::PythonTape))
}

/// The Python GT's event names, mapped to ours.
fn python_kind(name: &str) -> Option<EventKind> {
    match name {
        "MODIFIER_INJECT" => Some(EventKind::Inject),
        _ => EventKind::from_name(name),
    }
}

/// `CLIENT CLIENT 006b8b4568` (its doubled prefix) and `CLIENT 127.0.0.1:1` alike.
fn python_source(kind: EventKind, raw: &str) -> String {
    let mut id = raw.trim();
    for prefix in ["CLIENT ", "WORKER "] {
        while let Some(rest) = id.strip_prefix(prefix) {
            id = rest.trim_start();
        }
    }
    let worker =
        matches!(kind, EventKind::WorkerSend | EventKind::WorkerRecv) || raw.trim_start().starts_with("WORKER");
    format!("{} {id}", if worker { "WORKER" } else { "CLIENT" })
}

fn is_size(s: &str) -> bool {
    let s = s.trim();
    let num = s.strip_suffix("MB").or_else(|| s.strip_suffix("KB")).or_else(|| s.strip_suffix('B'));
    num.is_some_and(|n| !n.is_empty() && n.parse::<f64>().is_ok())
}

fn python_bytes(s: &str) -> u64 {
    let s = s.trim();
    let (n, scale) = if let Some(n) = s.strip_suffix("MB") {
        (n, 1024.0 * 1024.0)
    } else if let Some(n) = s.strip_suffix("KB") {
        (n, 1024.0)
    } else {
        (s.trim_end_matches('B'), 1.0)
    };
    n.parse::<f64>().map(|v| (v * scale).round() as u64).unwrap_or(0)
}

fn parse_python_seq(line: &str) -> Option<LogEvent> {
    let parts: Vec<&str> = line.split(" | ").collect();
    if parts.len() < 5 {
        return None;
    }
    let elapsed: f64 = parts[0].trim().strip_suffix('s')?.parse().ok().filter(|x: &f64| x.is_finite())?;
    let seq: u64 = parts[1].trim().strip_prefix('#')?.parse().ok()?;
    let kind = python_kind(parts[2].trim())?;
    let source = python_source(kind, parts[3]);
    let command = parts[4].trim().to_string();
    let (bytes, rest) = match parts.get(5) {
        Some(s) if is_size(s) => (python_bytes(s), &parts[6.min(parts.len())..]),
        _ => (0, &parts[5.min(parts.len())..]),
    };
    let details = rest.join(" | ").trim().to_string();
    Some(LogEvent { elapsed: elapsed.max(0.0), seq, kind, source, command, bytes, duration: None, details })
}

fn parse_python_tape(line: &str) -> Option<LogEvent> {
    let rest = line.trim_start().strip_prefix("[TAPE ")?;
    let (elapsed, rest) = rest.split_once("s]")?;
    let elapsed: f64 = elapsed.trim().parse().ok().filter(|x: &f64| x.is_finite())?;
    let parts: Vec<&str> = rest.split(" | ").collect();
    if parts.len() < 3 {
        return None;
    }
    let kind = python_kind(parts[0].trim())?;
    let source = python_source(kind, parts[1]);
    let command = parts[2].trim().to_string();
    let details = parts[3..].join(" | ").trim().to_string();
    Some(LogEvent { elapsed: elapsed.max(0.0), seq: 0, kind, source, command, bytes: 0, duration: None, details })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tape(text: &str) -> Result<Tape, TapeError> {
        let mut t = Tape::from_reader(text.as_bytes(), Path::new("test.log"))?;
        t.sort();
        Ok(t)
    }

    #[test]
    fn reads_gt_logs_in_time_order() {
        let exec = LogEvent {
            elapsed: 0.0015,
            seq: 3,
            kind: EventKind::Exec,
            source: "WORKER worker-0".into(),
            command: "add".into(),
            bytes: 16,
            duration: Some(0.00001),
            details: "client=1 #2 %b2 = add %b0, %b1".into(),
        };
        let recv = LogEvent {
            elapsed: 0.001,
            seq: 1,
            kind: EventKind::Recv,
            source: "CLIENT 1".into(),
            command: "add".into(),
            bytes: 40,
            duration: None,
            details: "#2 %2 = add %0, %1".into(),
        };
        let text = format!("{}\n{recv}\n{exec}\n", gt_transport::event::log_header("2026-11-24T20:00:00Z"));
        let t = tape(&text).unwrap();
        assert_eq!((t.format, t.skipped, t.events.len()), (LogFormat::Gt, 0, 2));
        assert_eq!(t.events[1].duration, Some(0.00001));
        assert_eq!(exec_origin(&t.events[1]), Some(("1".into(), 2)));
        assert_eq!(recv_seq(&t.events[0]), Some(2));
        assert_eq!(t.lanes(), vec![Lane::Client("1".into()), Lane::Dispatcher, Lane::Worker("worker-0".into())]);
        assert!((t.end() - 0.00151).abs() < 1e-12);
    }

    #[test]
    fn reads_the_python_gts_formats() {
        let seq = include_str!("../tests/data/python-gt.log");
        let t = tape(seq).unwrap();
        assert_eq!(t.format, LogFormat::PythonSeq);
        assert_eq!(t.events.len(), 4);
        let e = &t.events[0];
        assert_eq!((e.source.as_str(), e.command.as_str(), e.bytes), ("CLIENT 006b8b4568", "BinaryOp", 123 * 1024));
        assert_eq!(OpFamily::of(&e.command, &e.details), OpFamily::Binary);
        assert_eq!(
            (t.events[1].source.as_str(), t.events[1].details.as_str()),
            ("WORKER auto_worker", "[1 cmds: WorkerBinaryOp]")
        );
        assert_eq!(t.events[2].kind, EventKind::Inject);
        let old = "[TAPE 0.003s] WORKER_SEND  | auto_worker     | WorkerOp  | op=matmul result=127.0.0.1:59712_2\n\
                   [TAPE 0.001s] RECV         | 127.0.0.1:59712 | UnaryOp   | result=1 op=relu input=0\n";
        let t = tape(old).unwrap();
        assert_eq!(t.format, LogFormat::PythonTape);
        assert_eq!(t.events[0].source, "CLIENT 127.0.0.1:59712");
        assert_eq!(OpFamily::of(&t.events[0].command, &t.events[0].details), OpFamily::Relu);
        assert_eq!(t.events[1].source, "WORKER auto_worker");
        assert_eq!(OpFamily::of(&t.events[1].command, &t.events[1].details), OpFamily::MatMul);
    }

    #[test]
    fn bad_logs_are_errors_that_say_why() {
        let err = |text: &str| tape(text).unwrap_err().to_string();
        assert!(err("").contains("is empty"), "{}", err(""));
        assert!(err("fn main() { println!(\"a | b\"); }\n").contains("not an instruction log"));
        assert!(err("[package]\nname = \"gt\"\n").contains("not an instruction log: no line is a log event (line 1"));
        let header = gt_transport::event::log_header("2026-11-24T20:00:00Z");
        assert!(err(&header).contains("no events"), "{}", err(&header));
        // A truncated last line is skipped and counted.
        let line = "  0.001000s | #0001 | RECV         | CLIENT 1 | add | | #1 %2 = add %0, %1";
        let t = tape(&format!("{header}{line}\n{}", &line[..20])).unwrap();
        assert_eq!((t.events.len(), t.skipped), (1, 1));
        // A time that is no number is no event (a Perfetto export wrote `"ts": null`).
        let t = tape("[TAPE 0.003s] RECV | c | d | e\n[TAPE nans] RECV | c | d | e\n[TAPE infs] RECV | c | d | e\n")
            .unwrap();
        assert_eq!((t.events.len(), t.skipped), (1, 2));
        let nan = line.replacen("0.001000s", "NaNs", 1);
        assert_eq!(tape(&format!("{header}{line}\n{nan}\n")).unwrap().skipped, 1);
    }

    #[test]
    fn families_follow_the_op_table() {
        let f = |c| OpFamily::of(c, "");
        assert_eq!(
            [
                f("matmul"),
                f("add"),
                f("exp"),
                f("relu"),
                f("sum"),
                f("mean"),
                f("max"),
                f("get"),
                f("free"),
                f("fused")
            ],
            [
                OpFamily::MatMul,
                OpFamily::Binary,
                OpFamily::Unary,
                OpFamily::Relu,
                OpFamily::Sum,
                OpFamily::Mean,
                OpFamily::Reduce,
                OpFamily::Get,
                OpFamily::Free,
                OpFamily::Fused
            ]
        );
        assert_eq!(f("all_gather"), OpFamily::Collective);
        assert_eq!(f("Exec"), OpFamily::Other);
    }
}
