//! `gt perfetto`: a tape as Chrome trace-event JSON (the Trace Event Format), which Perfetto
//! (ui.perfetto.dev) and Chrome's `about:tracing` open. One process per client, the
//! dispatcher and each worker (in the tape's lane order); on a worker, one complete (`X`)
//! slice per executed instruction (name = op, args = the instruction, its client and
//! sequence number, result types, bytes, signal); on a client, a short slice per instruction received,
//! with a flow arrow to the slice that executed it, and its signal scopes as `B`/`E` slices on
//! a thread of their own; counter tracks for each worker's live bytes and each client's
//! queue; everything else (batches, replies, passes' injections, errors) as instant events.
//! Times are microseconds since the dispatcher started.

use crate::tape::{exec_origin, recv_seq, Lane, OpFamily, Tape};
use gt_transport::EventKind;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;

/// A client's slice for an instruction received lasts this long (µs): long enough to see and
/// for a flow arrow to bind to, short against anything executed.
const RECV_SLICE_US: f64 = 1.0;

/// Threads within each process.
const MAIN: u32 = 0;
const SIGNALS: u32 = 1;
const MESSAGES: u32 = 2;

/// What a trace holds, for the summary line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceCounts {
    /// Executed instructions (worker slices).
    pub slices: usize,
    /// Flow arrows from a client's instruction to its execution.
    pub flows: usize,
    /// Signal scopes.
    pub signals: usize,
    /// Counter samples.
    pub counters: usize,
    /// Instant events.
    pub instants: usize,
}

/// The trace of `tape`, as JSON, and what it holds.
pub fn trace(tape: &Tape) -> (Value, TraceCounts) {
    collect(|sink| each_event(tape, sink), other_data(tape))
}

/// Writes the trace of `tape` to `out`, one event at a time (a log of 10^6 events never
/// becomes one JSON value in memory).
pub fn write(tape: &Tape, out: impl Write) -> Result<TraceCounts, serde_json::Error> {
    stream(out, |sink| each_event(tape, sink), &other_data(tape))
}

/// Where a trace's events go, one at a time.
pub(crate) type EventSink<'a> = dyn FnMut(Value) -> Result<(), serde_json::Error> + 'a;

/// A whole trace of the events `events` makes (and what it says of them) as one JSON value.
pub(crate) fn collect<C>(
    events: impl FnOnce(&mut EventSink<'_>) -> Result<C, serde_json::Error>,
    other_data: Value,
) -> (Value, C) {
    let mut all: Vec<Value> = Vec::new();
    let counts = events(&mut |e| {
        all.push(e);
        Ok(())
    })
    .expect("collecting cannot fail");
    (json!({ "traceEvents": all, "displayTimeUnit": "ms", "otherData": other_data }), counts)
}

/// Writes a trace to `out` as `events` makes its events, one at a time.
pub(crate) fn stream<C>(
    mut out: impl Write,
    events: impl FnOnce(&mut EventSink<'_>) -> Result<C, serde_json::Error>,
    other_data: &Value,
) -> Result<C, serde_json::Error> {
    out.write_all(b"{\"traceEvents\":[\n").map_err(serde_json::Error::io)?;
    let mut first = true;
    let counts = events(&mut |e| {
        if !std::mem::take(&mut first) {
            out.write_all(b",\n").map_err(serde_json::Error::io)?;
        }
        serde_json::to_writer(&mut out, &e)
    })?;
    out.write_all(b"\n],\"displayTimeUnit\":\"ms\",\"otherData\":").map_err(serde_json::Error::io)?;
    serde_json::to_writer(&mut out, other_data)?;
    out.write_all(b"}\n").map_err(serde_json::Error::io)?;
    Ok(counts)
}

fn other_data(tape: &Tape) -> Value {
    json!({ "producer": "gt perfetto", "format": tape.format.name() })
}

/// Makes the trace's events in order, handing each to `sink`.
fn each_event(
    tape: &Tape,
    sink: &mut dyn FnMut(Value) -> Result<(), serde_json::Error>,
) -> Result<TraceCounts, serde_json::Error> {
    let lanes = tape.lanes();
    let pid_of: HashMap<&Lane, u32> = lanes.iter().enumerate().map(|(i, l)| (l, i as u32 + 1)).collect();
    let mut events = Sink { sink, failed: None };
    let mut counts = TraceCounts::default();
    for (lane, &pid) in lanes.iter().map(|l| (l, &pid_of[l])) {
        events.push(meta("process_name", pid, None, json!({ "name": lane.label() })));
        events.push(meta("process_sort_index", pid, None, json!({ "sort_index": pid })));
        let main = match lane {
            Lane::Worker(_) => "execution",
            Lane::Client(_) => "instructions",
            Lane::Dispatcher => "events",
        };
        events.push(meta("thread_name", pid, Some(MAIN), json!({ "name": main })));
        if matches!(lane, Lane::Client(_)) {
            events.push(meta("thread_name", pid, Some(SIGNALS), json!({ "name": "signals" })));
        }
        if matches!(lane, Lane::Worker(_)) {
            events.push(meta("thread_name", pid, Some(MESSAGES), json!({ "name": "messages" })));
        }
    }
    // Which client instruction ran where: (client, seq) -> the RECV's time, for flows, and
    // its signal scope, for the slice's args.
    let mut received: HashMap<(String, u64), (f64, Option<String>)> = HashMap::new();
    // Open signal scopes per client (names), to close what a log leaves open.
    let mut open: HashMap<u32, Vec<String>> = HashMap::new();
    let mut next_flow = 1u64;
    // A client's instruction slices end where its next one starts, if sooner: slices on one
    // thread must not overlap.
    let mut recv_end: Vec<f64> = vec![f64::INFINITY; tape.events.len()];
    let mut last_recv: HashMap<String, usize> = HashMap::new();
    for (i, e) in tape.events.iter().enumerate() {
        if let (EventKind::Recv, Lane::Client(c)) = (e.kind, Lane::of(e)) {
            if let Some(prev) = last_recv.insert(c, i) {
                recv_end[prev] = us(e.elapsed);
            }
        }
    }
    for (i, e) in tape.events.iter().enumerate() {
        let lane = Lane::of(e);
        let pid = pid_of[&lane];
        let ts = us(e.elapsed);
        let family = OpFamily::of(&e.command, &e.details).name();
        match (e.kind, &lane) {
            (EventKind::Exec, Lane::Worker(_)) => {
                let origin = exec_origin(e);
                let scope = origin.as_ref().and_then(|o| received.get(o)).and_then(|(_, s)| s.clone());
                let mut args = json!({ "instruction": e.details, "bytes": e.bytes });
                if let Some((client, seq)) = &origin {
                    args["client"] = json!(client);
                    args["seq"] = json!(seq);
                }
                if let Some(s) = scope {
                    args["signal"] = json!(s);
                }
                if let Some(r) = crate::tape::detail(&e.details, "result") {
                    args["result"] = json!(r);
                }
                let dur = us(e.duration.unwrap_or(0.0).max(0.0));
                events.push(json!({
                    "name": e.command, "cat": family, "ph": "X", "ts": ts, "dur": dur,
                    "pid": pid, "tid": MAIN, "args": args,
                }));
                counts.slices += 1;
                if let Some(recv_ts) = origin.as_ref().and_then(|o| received.get(o)).map(|(t, _)| *t) {
                    let client_pid = origin.and_then(|(c, _)| pid_of.get(&Lane::Client(c)).copied());
                    if let Some(client_pid) = client_pid.filter(|_| recv_ts <= ts) {
                        let id = next_flow;
                        next_flow += 1;
                        events.push(json!({
                            "name": "dispatch", "cat": "flow", "ph": "s", "id": id,
                            "ts": recv_ts, "pid": client_pid, "tid": MAIN,
                        }));
                        // Bound to the slice that encloses its time: the execution.
                        events.push(json!({
                            "name": "dispatch", "cat": "flow", "ph": "f", "bp": "e", "id": id,
                            "ts": ts, "pid": pid, "tid": MAIN,
                        }));
                        counts.flows += 1;
                    }
                }
            }
            (EventKind::Recv, Lane::Client(c)) => {
                let scope = signal_of(&e.details);
                if let Some(seq) = recv_seq(e) {
                    received.insert((c.clone(), seq), (ts, scope.clone()));
                }
                let mut args = json!({ "instruction": e.details, "bytes": e.bytes });
                if let Some(s) = scope {
                    args["signal"] = json!(s);
                }
                let dur = RECV_SLICE_US.min(recv_end[i] - ts).max(0.0);
                events.push(json!({
                    "name": e.command, "cat": family, "ph": "X", "ts": ts, "dur": dur,
                    "pid": pid, "tid": MAIN, "args": args,
                }));
            }
            (EventKind::Signal, Lane::Client(_)) => {
                let name = signal_name(&e.details);
                let stack = open.entry(pid).or_default();
                if e.command == "enter" {
                    stack.push(name.clone());
                    events.push(json!({
                        "name": name, "cat": "signal", "ph": "B", "ts": ts, "pid": pid, "tid": SIGNALS,
                        "args": { "details": e.details },
                    }));
                    counts.signals += 1;
                } else if stack.last() == Some(&name) {
                    stack.pop();
                    events.push(
                        json!({ "name": name, "cat": "signal", "ph": "E", "ts": ts, "pid": pid, "tid": SIGNALS }),
                    );
                }
            }
            (EventKind::Status, _) => {
                let (name, args) = match e.command.as_str() {
                    "memory" => ("live bytes", json!({ "bytes": number(&e.details, "live") })),
                    "queue" => (
                        "queue",
                        json!({ "instructions": number(&e.details, "instrs"), "bytes": number(&e.details, "bytes") }),
                    ),
                    _ => continue,
                };
                events.push(json!({ "name": name, "ph": "C", "ts": ts, "pid": pid, "tid": MAIN, "args": args }));
                counts.counters += 1;
            }
            _ => {
                let tid = if matches!(lane, Lane::Worker(_)) { MESSAGES } else { MAIN };
                let name = format!("{} {}", e.kind.name(), e.command);
                events.push(json!({
                    "name": name, "cat": family, "ph": "i", "s": "t", "ts": ts, "pid": pid, "tid": tid,
                    "args": { "details": e.details, "bytes": e.bytes, "seq": e.seq },
                }));
                counts.instants += 1;
            }
        }
    }
    // Scopes a log leaves open (a run cut short) end with it.
    let end = us(tape.end());
    let mut unclosed: Vec<(u32, Vec<String>)> = open.into_iter().collect();
    unclosed.sort_by_key(|(pid, _)| *pid);
    for (pid, stack) in unclosed {
        for name in stack.into_iter().rev() {
            events.push(json!({ "name": name, "cat": "signal", "ph": "E", "ts": end, "pid": pid, "tid": SIGNALS }));
        }
    }
    events.finish().map(|()| counts)
}

/// Where events go: after a failed write the rest are dropped and the error is returned at
/// the end.
struct Sink<'a> {
    sink: &'a mut dyn FnMut(Value) -> Result<(), serde_json::Error>,
    failed: Option<serde_json::Error>,
}

impl Sink<'_> {
    fn push(&mut self, event: Value) {
        if self.failed.is_none() {
            self.failed = (self.sink)(event).err();
        }
    }

    fn finish(self) -> Result<(), serde_json::Error> {
        self.failed.map_or(Ok(()), Err)
    }
}

fn us(seconds: f64) -> f64 {
    // Nanosecond resolution is all a log carries.
    (seconds * 1e9).round() / 1e3
}

fn meta(name: &str, pid: u32, tid: Option<u32>, args: Value) -> Value {
    json!({ "name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid.unwrap_or(MAIN), "args": args })
}

/// `signal=NAME` in a RECV's details.
fn signal_of(details: &str) -> Option<String> {
    crate::tape::detail(details, "signal").map(str::to_string)
}

/// A SIGNAL's name: `#SEQ NAME depth=D` (gt) or `signal=NAME` (the Python GT).
fn signal_name(details: &str) -> String {
    if let Some(s) = crate::tape::detail(details, "signal") {
        return s.to_string();
    }
    let mut words = details.split_whitespace().filter(|w| !w.starts_with('#'));
    words.next().unwrap_or("signal").to_string()
}

fn number(details: &str, key: &str) -> u64 {
    crate::tape::detail(details, key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A broken rule of the Trace Event Format (as Chrome's trace viewer and Perfetto's importer
/// read it) found in a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// The event's index in `traceEvents`.
    pub event: usize,
    /// The rule.
    pub rule: &'static str,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "traceEvents[{}]: {}", self.event, self.rule)
    }
}

/// Checks `trace` against the Trace Event Format's rules: required fields and their types
/// per phase, microsecond numbers, `X` durations, `B`/`E` nesting per thread, complete
/// slices nesting per thread, metadata names and arguments, counters' numeric arguments, and
/// flows (one start and one end per id, same name and category, in time order, each bound to
/// a slice enclosing its time on its thread).
pub fn violations(trace: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    let Some(events) = trace.get("traceEvents").and_then(Value::as_array) else {
        return vec![Violation { event: 0, rule: "the trace is an object with a traceEvents array" }];
    };
    let mut bad = |event: usize, rule: &'static str| out.push(Violation { event, rule });
    type Thread = (u64, u64);
    let mut slices: HashMap<Thread, Vec<(f64, f64)>> = HashMap::new();
    let mut stacks: HashMap<Thread, Vec<(String, f64)>> = HashMap::new();
    let mut flows: HashMap<u64, Vec<(usize, &Value)>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let (Some(ph), Some(pid), Some(tid)) = (
            e.get("ph").and_then(Value::as_str),
            e.get("pid").and_then(Value::as_u64),
            e.get("tid").and_then(Value::as_u64),
        ) else {
            bad(i, "every event has a string ph and integer pid and tid");
            continue;
        };
        let name = e.get("name").and_then(Value::as_str);
        let ts = e.get("ts").and_then(Value::as_f64);
        if ph != "M" && !ts.is_some_and(|t| t.is_finite() && t >= 0.0) {
            bad(i, "ts is a non-negative number of microseconds");
            continue;
        }
        let ts = ts.unwrap_or(0.0);
        if name.is_none() && ph != "E" {
            bad(i, "every event but E has a string name");
        }
        let thread = (pid, tid);
        match ph {
            "X" => match e.get("dur").and_then(Value::as_f64) {
                Some(d) if d.is_finite() && d >= 0.0 => slices.entry(thread).or_default().push((ts, ts + d)),
                _ => bad(i, "an X event has a non-negative number dur"),
            },
            "B" => stacks.entry(thread).or_default().push((name.unwrap_or("").to_string(), ts)),
            "E" => match stacks.entry(thread).or_default().pop() {
                Some((open, start)) => {
                    if name.is_some_and(|n| n != open) {
                        bad(i, "an E closes the B most recently opened on its thread");
                    }
                    if ts < start {
                        bad(i, "an E is not earlier than its B");
                    }
                }
                None => bad(i, "an E has a B open on its thread"),
            },
            "i" | "I" => {
                if e.get("s").and_then(Value::as_str).is_some_and(|s| !matches!(s, "g" | "p" | "t")) {
                    bad(i, "an instant's scope s is g, p or t");
                }
            }
            "C" => {
                let numeric = e
                    .get("args")
                    .and_then(Value::as_object)
                    .is_some_and(|a| !a.is_empty() && a.values().all(|v| v.as_f64().is_some_and(f64::is_finite)));
                if !numeric {
                    bad(i, "a counter's args are named numbers");
                }
            }
            "s" | "t" | "f" => match e.get("id").and_then(Value::as_u64) {
                Some(id) => flows.entry(id).or_default().push((i, e)),
                None => bad(i, "a flow event has an id"),
            },
            "M" => {
                let key = match name {
                    Some("process_name" | "thread_name" | "process_labels") => "name",
                    Some("process_sort_index" | "thread_sort_index") => "sort_index",
                    _ => {
                        bad(i, "metadata is process_name, process_labels, process_sort_index, thread_name or thread_sort_index");
                        continue;
                    }
                };
                let arg = e.get("args").and_then(|a| a.get(key));
                let ok = if key == "name" { arg.is_some_and(Value::is_string) } else { arg.is_some_and(Value::is_i64) };
                if !ok {
                    bad(i, "metadata carries its value in args (name: a string, sort_index: an integer)");
                }
            }
            _ => bad(i, "ph is one of the phases written here (X B E i I C s t f M)"),
        }
    }
    for (thread, stack) in &stacks {
        if !stack.is_empty() {
            let at = events.iter().rposition(|e| e["pid"] == thread.0 && e["tid"] == thread.1).unwrap_or(0);
            bad(at, "every B is closed by an E");
        }
    }
    for list in slices.values_mut() {
        list.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    }
    for (thread, list) in &slices {
        // Slices on a thread nest: each starts after the enclosing one starts and ends
        // before it ends.
        let mut open: Vec<f64> = Vec::new();
        for &(start, end) in list {
            while open.last().is_some_and(|&e| e <= start) {
                open.pop();
            }
            if open.last().is_some_and(|&e| end > e + 1e-6) {
                let at = events.iter().position(|e| e["pid"] == thread.0 && e["tid"] == thread.1).unwrap_or(0);
                bad(at, "complete slices on one thread nest (none overlaps another partly)");
                break;
            }
            open.push(end);
        }
    }
    let encloses = |e: &Value| {
        let (pid, tid, ts) = (e["pid"].as_u64(), e["tid"].as_u64(), e["ts"].as_f64().unwrap_or(-1.0));
        let thread = (pid.unwrap_or(0), tid.unwrap_or(0));
        slices.get(&thread).is_some_and(|l| l.iter().any(|&(s, end)| s <= ts && ts <= end))
    };
    for list in flows.values() {
        let phases: Vec<&str> = list.iter().map(|(_, e)| e["ph"].as_str().unwrap_or("")).collect();
        let (first, e0) = list[0];
        if phases.first() != Some(&"s")
            || phases.last() != Some(&"f")
            || phases.iter().filter(|p| **p == "s").count() != 1
        {
            bad(first, "a flow id has one s, then any t, then one f");
            continue;
        }
        for (i, e) in list {
            if e["name"] != e0["name"] || e["cat"] != e0["cat"] || e.get("cat").is_none() {
                bad(*i, "a flow's events share its name and cat");
            }
            if e["ts"].as_f64() < e0["ts"].as_f64() {
                bad(*i, "a flow's events are in time order");
            }
            if !encloses(e) {
                bad(*i, "a flow event is bound to a slice enclosing its time on its thread");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_transport::LogEvent;
    use std::path::Path;

    fn event(
        elapsed: f64,
        kind: EventKind,
        source: &str,
        command: &str,
        duration: Option<f64>,
        details: &str,
    ) -> LogEvent {
        LogEvent {
            elapsed,
            seq: 0,
            kind,
            source: source.into(),
            command: command.into(),
            bytes: 64,
            duration,
            details: details.into(),
        }
    }

    fn tape(events: Vec<LogEvent>) -> Tape {
        let text: String = events
            .iter()
            .enumerate()
            .map(|(i, e)| format!("{}\n", LogEvent { seq: i as u64 + 1, ..e.clone() }))
            .collect();
        let mut t = Tape::from_reader(text.as_bytes(), Path::new("t.log")).unwrap();
        t.sort();
        t
    }

    fn run() -> Tape {
        use EventKind::*;
        tape(vec![
            event(0.001, Connect, "WORKER worker-0", "Register", None, "worker=0 backend=cpu"),
            event(0.002, Connect, "CLIENT 1", "Hello", None, "name=x"),
            event(0.003, Signal, "CLIENT 1", "enter", None, "#0 fwd depth=1"),
            event(0.0030001, Recv, "CLIENT 1", "randn", None, "#1 %0 = randn f32[4] seed=1 signal=fwd"),
            event(0.0030001, Recv, "CLIENT 1", "relu", None, "#2 %1 = relu %0 signal=fwd"),
            event(0.0031, Signal, "CLIENT 1", "exit", None, "#3 fwd depth=0"),
            event(0.0032, WorkerSend, "WORKER worker-0", "Exec", None, "batch=1 [2 ops: randn, relu]"),
            event(0.0033, Exec, "WORKER worker-0", "randn", Some(0.00002), "client=1 #1 %b0 = randn f32[4] seed=1"),
            event(0.00332, Exec, "WORKER worker-0", "relu", Some(0.00001), "client=1 #2 result=f32[4] %b1 = relu %b0"),
            event(0.0034, WorkerRecv, "WORKER worker-0", "Done", None, "batch=1 ok=2 failed=0"),
            event(0.0034, Status, "WORKER worker-0", "memory", None, "live=32"),
            event(0.0035, Status, "CLIENT 1", "queue", None, "instrs=0 bytes=0"),
            event(0.0036, Inject, "PASS fuse", "fused", None, "client=1 #2 ..."),
            // A scope the run never closed.
            event(0.004, Signal, "CLIENT 1", "enter", None, "#4 bwd depth=1"),
        ])
    }

    #[test]
    fn a_run_becomes_a_valid_trace() {
        let (trace, counts) = trace(&run());
        assert_eq!(violations(&trace), vec![]);
        assert_eq!(counts, TraceCounts { slices: 2, flows: 2, signals: 2, counters: 2, instants: 5 });
        let events = trace["traceEvents"].as_array().unwrap();
        let relu = events.iter().find(|e| e["ph"] == "X" && e["name"] == "relu" && e["pid"] == 3).unwrap();
        assert_eq!((relu["ts"].as_f64(), relu["dur"].as_f64()), (Some(3320.0), Some(10.0)));
        assert_eq!((relu["args"]["client"].as_str(), relu["args"]["seq"].as_u64()), (Some("1"), Some(2)));
        assert_eq!((&relu["args"]["signal"], &relu["args"]["result"]), (&json!("fwd"), &json!("f32[4]")));
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["client 1", "dispatcher", "worker-0"]);
        // Two instructions received at the same time: zero-length slices, not overlapping.
        let recvs: Vec<f64> =
            events.iter().filter(|e| e["ph"] == "X" && e["pid"] == 1).map(|e| e["dur"].as_f64().unwrap()).collect();
        assert_eq!(recvs, [0.0, 1.0]);
    }

    #[test]
    fn the_streamed_file_is_the_trace() {
        let mut out = Vec::new();
        let counts = write(&run(), &mut out).unwrap();
        let (trace, expected) = trace(&run());
        assert_eq!(counts, expected);
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), trace);
    }

    #[test]
    fn the_checker_finds_broken_traces() {
        let (good, _) = trace(&run());
        let broken = |edit: &dyn Fn(&mut Vec<Value>)| {
            let mut t = good.clone();
            edit(t["traceEvents"].as_array_mut().unwrap());
            violations(&t).into_iter().map(|v| v.rule).collect::<Vec<_>>()
        };
        let rules =
            broken(&|e| e.push(json!({ "name": "x", "ph": "X", "ts": 3325.0, "dur": 100.0, "pid": 3, "tid": 0 })));
        assert!(rules.iter().any(|r| r.contains("nest")), "{rules:?}");
        let rules = broken(&|e| e.push(json!({ "ph": "E", "ts": 1.0, "pid": 9, "tid": 0 })));
        assert!(rules.iter().any(|r| r.contains("B open")), "{rules:?}");
        let rules = broken(&|e| e.retain(|e| e["ph"] != "f"));
        assert!(rules.iter().any(|r| r.contains("one s")), "{rules:?}");
        let rules = broken(&|e| e.push(json!({ "name": "x", "ph": "X", "ts": -1.0, "dur": 1.0, "pid": 3, "tid": 0 })));
        assert!(rules.iter().any(|r| r.contains("non-negative")), "{rules:?}");
        let rules =
            broken(&|e| e.push(json!({ "name": "c", "ph": "C", "ts": 1.0, "pid": 3, "tid": 0, "args": { "a": "x" } })));
        assert!(rules.iter().any(|r| r.contains("counter")), "{rules:?}");
        let rules = broken(&|e| {
            for ev in e.iter_mut().filter(|ev| ev["ph"] == "f") {
                ev["ts"] = json!(1.0);
            }
        });
        assert!(rules.iter().any(|r| r.contains("time order")), "{rules:?}");
    }

    #[test]
    fn python_gt_logs_export_without_slices() {
        let text = "  0.123s | #0042 | RECV         | CLIENT CLIENT 006b8b4568 | BinaryOp        |      123KB | result=42 op=add\n\
                    \x20 0.124s | #0043 | WORKER_SEND  | WORKER auto_worker   | WorkerBatch     | [1 cmds: WorkerBinaryOp]\n";
        let t = Tape::from_reader(text.as_bytes(), Path::new("old.log")).unwrap();
        let (trace, counts) = trace(&t);
        assert_eq!(violations(&trace), vec![]);
        assert_eq!((counts.slices, counts.instants), (0, 1));
    }
}
